"""Templates of the generated runner (run.sh) and, later, batch job scripts.

Installed as the package ``compose2sif.runner`` so that an installed compose2sif finds them.
"""

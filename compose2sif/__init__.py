"""compose2sif: run Docker Compose projects as rootless Apptainer/Singularity instances."""

__version__ = "0.1.0"

"""Stage 1: read a compose project as Docker Compose does. See :mod:`compose2sif.load.loader`."""
from compose2sif.load.encode import encode_project
from compose2sif.load.loader import Project, ProjectOptions, load_project

__all__ = ["Project", "ProjectOptions", "load_project", "encode_project"]

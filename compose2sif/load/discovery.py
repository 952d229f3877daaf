"""What the command line and the environment select: the compose files, the env files, the project name
(compose-go's cli/options.go)."""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional

from compose2sif.errors import ComposeError
from compose2sif.load import dotenv
from compose2sif.load.interpolate import interpolate_tree
from compose2sif.load.validate import go_quote

DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
OVERRIDE_FILES = ("compose.override.yml", "compose.override.yaml",
                  "docker-compose.override.yml", "docker-compose.override.yaml")


def absolute(path: str, base: str) -> str:
    path = os.path.expanduser(path)
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path))


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ComposeError("no such file") .located(path) from None
    except IsADirectoryError:
        raise ComposeError("is a directory, not a file").located(path) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise ComposeError(f"cannot read: {exc}").located(path) from None


def read_env_files(paths: List[str], current: Dict[str, str]) -> Dict[str, str]:
    """Dotenv files in order; a value may use variables of ``current`` and of earlier lines."""
    values: Dict[str, str] = {}
    for path in paths:
        if not os.path.exists(path):
            raise ComposeError("couldn't find env file").located(path)
        if os.path.isdir(path):
            raise ComposeError("is a directory, not an env file").located(path)
        try:
            dotenv.parse(read_text(path), lambda k: current.get(k, values.get(k)), into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"invalid env file: {exc}").located(path) from None
    return {k: v for k, v in values.items() if not k[:1].isdigit()}


def discover(start: str) -> List[str]:
    directory = start
    while True:
        found = [os.path.join(directory, n) for n in DEFAULT_FILES if os.path.isfile(os.path.join(directory, n))]
        if found:
            overrides = [os.path.join(directory, n) for n in OVERRIDE_FILES
                         if os.path.isfile(os.path.join(directory, n))]
            return found[:1] + overrides[:1]
        parent = os.path.dirname(directory)
        if parent == directory:
            raise ComposeError(f"no configuration file provided: not found in {start} or its parents "
                               f"(looked for {', '.join(DEFAULT_FILES)})")
        directory = parent


def normalize_project_name(name: str) -> str:
    kept = "".join(ch for ch in name.lower() if ch in "abcdefghijklmnopqrstuvwxyz0123456789_-")
    return kept.lstrip("_-")


def checked_project_name(name: str) -> str:
    """A name given with -p or COMPOSE_PROJECT_NAME is used as given, so it must already be valid."""
    if normalize_project_name(name) != name:
        raise ComposeError(f"invalid project name {go_quote(name)}: must consist only of lowercase alphanumeric "
                           "characters, hyphens, and underscores as well as start with a letter or number")
    return name


def defining_file(paths: List[str], key: str, separator: str = "=") -> Optional[str]:
    """The last of ``paths`` with a line that sets ``key`` (to name it in an error)."""
    pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*{separator}", re.MULTILINE)
    for path in reversed(paths):
        try:
            if pattern.search(read_text(path)):
                return path
        except ComposeError:
            continue
    return None


def name_from_files(files: List[str], lookup, ctx) -> Optional[str]:
    """The last `name:` of the files, normalised (it may then be empty); None when no file has one."""
    name = ""
    for path in files:
        for doc in ctx.documents_of(path):
            value = doc.data.get("name")
            if isinstance(value, str) and value:
                name = value
    if not name:
        return None
    return normalize_project_name(interpolate_tree({"name": name}, lookup)["name"])


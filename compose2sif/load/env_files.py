"""``env_file`` and ``label_file``: each service's files read and merged under its own environment and
labels, which win (compose-go's WithServicesEnvironmentResolved and label files)."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from compose2sif.errors import ComposeError
from compose2sif.load import dotenv
from compose2sif.load.discovery import read_text


def merge_env_files(service: Dict[str, Any], environment: Dict[str, str], path: str) -> None:
    env_files = service.pop("env_file", None) or []
    if not env_files:
        return
    own = service.get("environment") or {}
    values: Dict[str, str] = {}

    def lookup(key: str) -> Optional[str]:
        if key in environment:
            return environment[key]
        return own.get(key)

    for env_file in env_files:
        file_path = env_file.get("path")
        if not os.path.exists(file_path):
            if env_file.get("required", True):
                raise ComposeError(f"env file {file_path} not found", path=f"{path}.env_file")
            continue
        try:
            if env_file.get("format") == "raw":
                values.update(_raw_env_file(read_text(file_path), environment))
            else:
                dotenv.parse(read_text(file_path), lambda k: lookup(k) if lookup(k) is not None else values.get(k),
                             into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"failed to parse env_file {file_path}: {exc}", path=f"{path}.env_file") from None
    merged: Dict[str, Optional[str]] = dict(values)
    merged.update(own)
    service["environment"] = merged


def _raw_env_file(text: str, environment: Dict[str, str]) -> Dict[str, str]:
    """``format: raw``: docker's --env-file rules. Each ``KEY=VALUE`` line is taken as written (no
    quotes, comments or variables); a bare ``KEY`` takes the environment's value, if any."""
    values: Dict[str, str] = {}
    for line in text.lstrip("\ufeff").splitlines():
        line = line.lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        key, found, value = line.partition("=")
        if not key:
            raise dotenv.DotenvError(f"no variable name on line '{line}'")
        if " " in key or "\t" in key:
            raise dotenv.DotenvError(f"variable '{key}' contains whitespaces")
        if found:
            values[key] = value
        elif key in environment:
            values[key] = environment[key]
    return values


def merge_label_files(service: Dict[str, Any], environment: Dict[str, str], path: str) -> None:
    """``label_file``: dotenv files of labels, under the service's own labels (which win)."""
    label_files = service.pop("label_file", None) or []
    if not label_files:
        return
    values: Dict[str, str] = {}
    for file_path in label_files:
        try:
            dotenv.parse(read_text(file_path), lambda k: environment.get(k, values.get(k)), into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"failed to parse label_file {file_path}: {exc}", path=f"{path}.label_file") from None
    own = service.get("labels") or {}
    if isinstance(own, list):
        own = dict((item.split("=", 1) + [""])[:2] for item in map(str, own))
    service["labels"] = {**values, **own}

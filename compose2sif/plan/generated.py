"""Generated secrets in place of public defaults.

Some projects ship secrets everybody knows (a `DB_PASSWORD=changeme123` in their compose file). On a
shared node every user reaches every loopback address, so those must go. Presets list the variables
and their public defaults (``Preset.secrets`` in compose2sif.adapters). A variable that is unset, or set to its public
default, gets a random value, kept 0600 in the output directory (``secrets.env``) and reused on the next convert.
The values reach the project through interpolation (the project is loaded again with them in its
environment, as if the user had set them), and any public default left over in a value (an
env_file line such as `BROKER_URL=kv://:changeme123@cache:6379/1`) is replaced too.
"""
from __future__ import annotations

import os
import re
import secrets as random
import shlex
from typing import Dict, List, Tuple

SECRETS_FILE = "secrets.env"


def read_stored(out_dir: str) -> Dict[str, str]:
    values: Dict[str, str] = {}
    try:
        with open(os.path.join(out_dir, SECRETS_FILE), encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    values[key] = value
    except OSError:
        pass
    return values


def choose(table: Dict[str, str], environment: Dict[str, str], stored: Dict[str, str]) -> Dict[str, str]:
    """The generated value of every variable left at its public default (or unset)."""
    chosen: Dict[str, str] = {}
    for variable, default in sorted(table.items()):
        value = environment.get(variable)
        if value is None or value == "" or value == default:
            chosen[variable] = stored.get(variable) or random.token_hex(24)
    return chosen


def file_text(chosen: Dict[str, str]) -> str:
    lines = ["# compose2sif: generated in place of public default secrets; reused by every convert"]
    return "\n".join(lines + [f"{k}={v}" for k, v in sorted(chosen.items())]) + "\n"


def users(out_dir: str, values: Dict[str, str]) -> Dict[str, List[str]]:
    """Variable -> the `service:VARIABLE` entries of the env files that carry its generated value."""
    found: Dict[str, List[str]] = {}
    env_dir = os.path.join(out_dir, "env")
    for name in sorted(os.listdir(env_dir)) if os.path.isdir(env_dir) else []:
        if not name.endswith(".env") or name.endswith(".eval.env"):
            continue
        with open(os.path.join(env_dir, name), encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and not key.startswith("#") and key != "C2S_LAUNCH":
                    for variable, secret in values.items():
                        if secret in "".join(shlex.split(value)):
                            found.setdefault(variable, []).append(f"{name[:-4]}:{key}")
    return found


class Replacer:
    """Replaces public defaults left in values by the generated secret of their variable. A default
    shared by several variables (a database's and a cache's password) goes to the one whose name the
    text's context names (`cache://...` -> CACHE_PASSWORD), else to the first."""

    def __init__(self, table: Dict[str, str], chosen: Dict[str, str]):
        self.chosen = chosen  # variable -> generated value, kept in SECRETS_FILE
        self.by_default: Dict[str, List[Tuple[str, str]]] = {}
        for variable, default in sorted(table.items()):
            if variable in chosen and default:
                self.by_default.setdefault(default, []).append((variable, chosen[variable]))
        # short defaults (one may also be an image name) are replaced only as whole values
        long = [d for d in self.by_default if len(d) >= 12]
        self._pattern = re.compile("|".join(re.escape(d) for d in sorted(long, key=len, reverse=True))) if long else None

    def _pick(self, default: str, where: str) -> str:
        candidates = self.by_default[default]
        for variable, value in candidates:
            if variable.split("_")[0].lower() in where:
                return value
        return candidates[0][1]

    def __call__(self, text: str, context: str = "") -> str:
        where = (context + " " + text).lower()
        if text in self.by_default:
            return self._pick(text, where)
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._pick(m.group(0), where), text)

    def __bool__(self) -> bool:
        return bool(self.by_default)

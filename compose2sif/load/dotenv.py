"""`.env` and env_file parsing with Docker Compose's rules (compose-go's dotenv parser).

Comments, ``export``, single quotes (literal), double quotes (escapes and interpolation),
unquoted values (interpolated, `` #`` starts a comment), bare names taken from the environment,
multi-line quoted values.
"""
from __future__ import annotations

import re
from typing import Callable, Dict, Optional

from compose2sif.load.interpolate import InterpolationError, substitute

Lookup = Callable[[str], Optional[str]]

_EXPORT = re.compile(r"^export\s+")
_ESCAPE = re.compile(r"(\\(?:[abcfnrtv$\"\\]|0\d{0,3}))")
_ESCAPES = {"a": "\a", "b": "\b", "c": "\\c", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            '"': '"', "\\": "\\"}
_SPACE = "\t\v\f\r \x85\xa0"


class DotenvError(ValueError):
    pass


def _expand_escapes(text: str) -> str:
    def repl(m: "re.Match[str]") -> str:
        seq = m.group(0)
        if seq == "\\$":
            return "$$"
        if seq.startswith("\\0"):
            digits = seq[2:]
            if not digits:
                return seq
            try:
                return chr(int(digits, 8)) if len(digits) == 3 else seq
            except ValueError:
                return seq
        return _ESCAPES.get(seq[1], seq)
    return _ESCAPE.sub(repl, text)


def parse(text: str, lookup: Optional[Lookup] = None, into: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Parse dotenv text. ``lookup`` resolves variables used in values and bare names; values
    defined earlier in the same file are visible after it."""
    out: Dict[str, str] = {} if into is None else into
    lookup = lookup or (lambda _name: None)
    if text.startswith("\ufeff"):
        text = text[1:]
    line = 1

    def resolve(name: str) -> Optional[str]:
        value = lookup(name)
        return value if value is not None else out.get(name)

    def expand(value: str) -> str:
        try:
            return substitute(value, resolve)
        except InterpolationError as exc:
            raise DotenvError(f"line {line}: {exc}") from None

    rest = text
    while True:
        # skip blank space and comment lines
        while True:
            stripped = rest.lstrip(" \t\n\v\f\r\x85\xa0")
            line += rest[:len(rest) - len(stripped)].count("\n")
            rest = stripped
            if not rest.startswith("#"):
                break
            nl = rest.find("\n")
            rest = "" if nl < 0 else rest[nl:]
        if not rest:
            return out
        if _EXPORT.match(rest):
            rest = rest[len("export"):].lstrip(_SPACE)
        key, offset, inherited = None, 0, False
        for i, ch in enumerate(rest):
            if ch in _SPACE:
                continue
            if ch in "=:\n":
                key, offset, inherited = rest[:i], i + 1, ch == "\n"
                break
            if ch in "_.-[]" or ch.isalnum():
                continue
            first_line = rest.split("\n", 1)[0]
            raise DotenvError(f"line {line}: unexpected character {ch!r} in variable name {first_line!r}")
        if key is None:  # last line without '=': a bare name
            key, offset, inherited = rest, len(rest), True
        key = key.rstrip()
        if " " in key:
            raise DotenvError(f"line {line}: key cannot contain a space")
        rest = rest[offset:].lstrip(_SPACE)
        if inherited:
            line += 1
            value = lookup(key)
            if value is not None:
                out[key] = value
            continue
        if rest[:1] in ("'", '"'):
            quote = rest[0]
            chars, escaped, end = [], False, -1
            for i in range(1, len(rest)):
                ch = rest[i]
                if ch == "\n":
                    line += 1
                if ch != quote:
                    if not escaped and ch == "\\":
                        escaped = True
                        continue
                    if escaped:
                        escaped = False
                        chars.append("\\")
                    chars.append(ch)
                    continue
                if escaped:
                    escaped = False
                    chars.append(ch)
                    continue
                end = i
                break
            if end < 0:
                raise DotenvError(f"line {line}: unterminated quoted value {rest.split(chr(10), 1)[0]}")
            value = "".join(chars)
            if quote == '"':
                value = expand(_expand_escapes(value))
            out[key] = value
            rest = rest[end + 1:]
            continue
        value, _, rest = rest.partition("\n")
        line += 1
        value = value.split(" #", 1)[0].rstrip()
        out[key] = expand(value)

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

_EXPORT = re.compile(r"export\s+")
_ESCAPE = re.compile(r"(\\(?:[abcfnrtv$\"\\]|0\d{0,3}))")
_ESCAPES = {"a": "\a", "b": "\b", "c": "\\c", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            '"': '"', "\\": "\\"}
_SPACE = "\t\v\f\r \x85\xa0"
_SPACES = re.compile("[\t\v\f\r \x85\xa0]*")
_BLANK = re.compile("[ \t\n\v\f\r\x85\xa0]*")  # blank space, lines included


def _line_at(text: str, pos: int) -> str:
    """The rest of the line that starts at POS."""
    return text[pos:].split("\n", 1)[0]


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

    # one position moves through the text (slicing off what was read would copy the rest of
    # the file at every line: a large .env such as Dify's is parsed hundreds of times slower)
    pos, end_of_text = 0, len(text)
    while True:
        # skip blank space and comment lines
        while True:
            start, pos = pos, _BLANK.match(text, pos).end()
            line += text.count("\n", start, pos)
            if not text.startswith("#", pos):
                break
            nl = text.find("\n", pos)
            pos = end_of_text if nl < 0 else nl
        if pos >= end_of_text:
            return out
        if _EXPORT.match(text, pos):
            pos = _SPACES.match(text, pos + len("export")).end()
        key, offset, inherited = None, 0, False
        for i in range(pos, end_of_text):
            ch = text[i]
            if ch in _SPACE:
                continue
            if ch in "=:\n":
                key, offset, inherited = text[pos:i], i + 1, ch == "\n"
                break
            if ch in "_.-[]" or ch.isalnum():
                continue
            raise DotenvError(f"line {line}: unexpected character {ch!r} in variable name {_line_at(text, pos)!r}")
        if key is None:  # last line without '=': a bare name
            key, offset, inherited = text[pos:], end_of_text, True
        key = key.rstrip()
        if " " in key:
            raise DotenvError(f"line {line}: key cannot contain a space")
        pos = _SPACES.match(text, offset).end()
        if inherited:
            line += 1
            value = lookup(key)
            if value is not None:
                out[key] = value
            continue
        if text[pos:pos + 1] in ("'", '"'):
            quote = text[pos]
            chars, escaped, end = [], False, -1
            for i in range(pos + 1, end_of_text):
                ch = text[i]
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
                raise DotenvError(f"line {line}: unterminated quoted value {_line_at(text, pos)}")
            value = "".join(chars)
            if quote == '"':
                value = expand(_expand_escapes(value))
            out[key] = value
            pos = end + 1
            continue
        nl = text.find("\n", pos)
        value, pos = (text[pos:], end_of_text) if nl < 0 else (text[pos:nl], nl + 1)
        line += 1
        value = value.split(" #", 1)[0].rstrip()
        out[key] = expand(value)

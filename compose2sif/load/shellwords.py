"""Split a string command the way Docker Compose does: go-shellwords v1.0.12's ``Parse``.

This is not POSIX word splitting (``shlex``). What differs, and changes what runs:

- a backslash outside single quotes escapes the next character, inside double quotes too
  (``"a\\b"`` gives ``ab``, ``"\\$!"`` gives ``$!``);
- ``;``, ``&``, ``|``, ``<`` and ``>`` outside quotes end the command: the rest is ignored, and a
  word that starts with a digit before ``>`` (``2>file``) is dropped;
- ``$(`` ... ``)`` and backquotes are kept as text, and keep their spaces;
- a ``(`` that does not follow ``$`` is an error, and so is a bare ``)`` that is never closed.
"""
from __future__ import annotations

from typing import List


class ShellwordsError(ValueError):
    """Compose's own wording: "invalid command line string"."""

    def __init__(self) -> None:
        super().__init__("invalid command line string")


_SPACE = " \t\r\n"
_NO, _SINGLE, _QUOTED = 0, 1, 2  # what the current word has seen: nothing, text, a closed quote


def split(line: str) -> List[str]:
    args: List[str] = []
    buf: List[str] = []
    escaped = double = single = back = dollar = False
    got = _NO
    for ch in line:
        if escaped:
            buf.append(ch)
            escaped = False
            got = _SINGLE
            continue
        if ch == "\\":
            if single:
                buf.append(ch)
            else:
                escaped = True
            continue
        if ch in _SPACE:
            if single or double or back or dollar:
                buf.append(ch)
            elif got != _NO:
                args.append("".join(buf))
                buf = []
                got = _NO
            continue
        if ch == "`":
            if not (single or double or dollar):
                back = not back
        elif ch == ")":
            if not (single or double or back):
                dollar = not dollar
        elif ch == "(":
            if not (single or double or back):
                if not dollar and buf and buf[-1] == "$":
                    dollar = True
                    buf.append(ch)
                    continue
                raise ShellwordsError()
        elif ch == '"':
            if not (single or dollar):
                if double:
                    got = _QUOTED
                double = not double
                continue
        elif ch == "'":
            if not (double or dollar):
                if single:
                    got = _QUOTED
                single = not single
                continue
        elif ch in ";&|<>":
            if not (single or double or back or dollar):
                if ch == ">" and buf and "0" <= buf[0] <= "9":
                    got = _NO
                break
        got = _SINGLE
        buf.append(ch)
    if got != _NO:
        args.append("".join(buf))
    if escaped or single or double or back or dollar:
        raise ShellwordsError()
    return args

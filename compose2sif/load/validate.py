"""Validation of a merged compose document, before normalisation: by the Compose Specification's schema,
as Compose validates each merged file (:mod:`schema`), with errors located at the file and line of the key."""
from __future__ import annotations

from typing import Any, Dict

from compose2sif.errors import ComposeError
from compose2sif.load.schema import schema_failure


def validate(model: Dict[str, Any], filename: str, line_of) -> None:
    """Raise ComposeError for what Compose's schema rejects, worded as Compose words it."""
    failure = schema_failure(model)
    if failure is not None:
        path, message = failure[1], failure[2]
        at = failure[3] if len(failure) > 3 else path
        raise ComposeError(message, path=".".join(path) or None, file=filename, line=line_of(*at) if at else None)


def go_quote(text: str, quote: str = '"') -> str:
    """``text`` between quotes, with control characters escaped as Go's %q does, so a hostile value
    prints on one line."""
    escapes = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b", "\f": "\\f",
               "\v": "\\v", "\\": "\\\\", quote: "\\" + quote}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return quote + "".join(out) + quote

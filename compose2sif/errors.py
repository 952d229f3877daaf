"""The one error type users see: a single line naming the file (and line), the service and the key."""
from __future__ import annotations

from typing import Optional


class ComposeError(Exception):
    """Bad input. The CLI prints ``str(err)`` on one line and exits non-zero; never a traceback."""

    def __init__(self, message: str, *, file: Optional[str] = None, line: Optional[int] = None,
                 path: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.path = path  # dotted compose path, e.g. "services.web.ports"

    def located(self, file: Optional[str], line: Optional[int] = None) -> "ComposeError":
        """Fill in where the problem is, unless a more precise location is already known."""
        if self.file is None:
            self.file, self.line = file, line
        return self

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        what = f"{self.path}: " if self.path else ""
        return " ".join((where + what + self.message).split("\n"))

"""Go-compatible parsing and formatting of durations, byte sizes and numbers.

Docker Compose is written in Go; `docker compose config` prints durations with Go's
``time.Duration.String()``, sizes as byte counts, and numbers with Go's ``%v``. We do the same so
our output can be compared with Compose's own.
"""
from __future__ import annotations

import re
import struct

_DURATION_UNITS = {
    "ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
    "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000, "w": 604_800_000_000_000,
}
_DURATION_PART = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")


def parse_duration(text: str) -> int:
    """Parse a Compose duration ("1m30s", "1.5s", "2h", "1d") into nanoseconds."""
    s = str(text)
    orig = s
    sign = 1
    if s and s[0] in "+-":
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"invalid duration {orig!r}")
    from decimal import Decimal  # here: most projects never need it, and `config` races a Go binary
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if not m or m.group(1) in ("", "."):
            raise ValueError(f"invalid duration {orig!r}")
        unit = _DURATION_UNITS.get(m.group(2))
        if unit is None:
            raise ValueError(f"unknown unit {m.group(2)!r} in duration {orig!r}")
        total += Decimal(m.group(1)) * unit
        pos = m.end()
    return sign * int(total)


def _frac(value: int, digits: int) -> str:
    """Go's fmtFrac: the fractional part of value/10**digits, trailing zeros removed."""
    text = str(value % 10 ** digits).rjust(digits, "0").rstrip("0")
    return "." + text if text else ""


def format_duration(ns: int) -> str:
    """Go's time.Duration.String()."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u < 1_000_000_000:
        if u < 1_000:
            return f"{sign}{u}ns"
        if u < 1_000_000:
            return f"{sign}{u // 1_000}{_frac(u, 3)}µs"
        return f"{sign}{u // 1_000_000}{_frac(u, 6)}ms"
    secs = u // 1_000_000_000
    out = f"{secs % 60}{_frac(u, 9)}s"
    minutes = secs // 60
    if minutes:
        out = f"{minutes % 60}m" + out
        hours = minutes // 60
        if hours:
            out = f"{hours}h" + out
    return sign + out


_RAM = re.compile(r"^(\d+(?:\.\d+)*) ?([kKmMgGtTpP])?[iI]?[bB]?$")
_RAM_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


def parse_bytes(value) -> int:
    """A size such as 64m, 1gb, 1.5G or 1024 in bytes (docker/go-units RAMInBytes)."""
    if isinstance(value, bool):
        raise ValueError(f"invalid size: {value!r}")
    if isinstance(value, int):
        return value
    text = str(value)
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    m = _RAM.match(text)
    if not m:
        raise ValueError(f"invalid size: {text!r}")
    try:
        number = float(m.group(1))
    except ValueError:
        raise ValueError(f"invalid size: {text!r}") from None
    unit = _RAM_UNITS.get((m.group(2) or "").lower(), 1)
    return int(number * unit)


def go_str(value) -> str:
    """fmt.Sprint(value) as Go prints a YAML scalar: true, 1.5, 1e+21, 42."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)


def go_float(value: float) -> str:
    """Go's %v for a float64: shortest digits, exponent form below 1e-4 or from 1e21."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    from decimal import Decimal
    d = Decimal(repr(value))
    exponent = d.adjusted()
    if -4 <= exponent < 21:
        text = format(d, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    sign, digits, _ = d.as_tuple()
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{'-' if sign else ''}{mantissa}e{'+' if exponent >= 0 else '-'}{abs(exponent):02d}"


def float32(value: float) -> float:
    """The shortest decimal that round-trips through a float32, as Go's JSON encoder prints it."""
    single = struct.unpack("f", struct.pack("f", value))[0]
    for precision in range(1, 10):
        candidate = float(f"{single:.{precision}g}")
        if struct.unpack("f", struct.pack("f", candidate))[0] == single:
            return candidate
    return single

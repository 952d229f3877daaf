"""The shape of a generated secret: what the service that reads it checks (``Rule``), read off
the public default it replaces or given by an adapter (``PublicDefault``). Shared by the adapters,
which know each reader's rule, and plan/generated.py, which generates and checks values."""
from __future__ import annotations

import base64
import re
import secrets as random
import string
from dataclasses import dataclass
from typing import Callable, Optional

MIN_LENGTH = 32   # a public default shorter than this ("difyai123456") is no model for a secret's length
PLACEHOLDER = re.compile(r"(?i)(replace[-_ ]?with\b.*|your[-_ ].*[-_ ]here|change[-_ ]?me)")
_URL_UNSAFE = re.compile(r"[\s+/@:%?#&=,;'\"\\`$<>{}\[\]|^~]")


def nonempty(value: str) -> bool:
    return bool(value.strip())


def url_safe(value: str) -> bool:
    """Fits as written inside a URL's userinfo, a YAML plain scalar and a shell word."""
    return nonempty(value) and not _URL_UNSAFE.search(value)


def header_token(value: str) -> bool:
    """Sent in an HTTP header and compared as it is: printable ASCII, nothing to trim."""
    return bool(value) and all(0x21 <= ord(c) < 0x7f for c in value)


def base64url_bytes(count: int) -> Callable[[str], bool]:
    """Unpadded base64url text that decodes to exactly ``count`` bytes."""
    def check(value: str) -> bool:
        text = value.strip()
        if not re.fullmatch(r"[A-Za-z0-9_-]+", text):
            return False
        try:
            return len(base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)) == count
        except ValueError:
            return False
    return check


@dataclass(frozen=True)
class Rule:
    """What a secret must look like for the service that reads it.

    ``alphabet``/``length``/``prefix``: how a value is generated (``decoded``: ``length`` random
    bytes written as unpadded base64url instead); ``check``: what the consumer's code accepts
    (``reader`` names it, ``why`` says it); ``keep_stored``: a value a database was initialised
    with, never replaced once stored; ``empty_is_own``: set empty, the reader makes and keeps a
    secret of its own (left alone)."""
    alphabet: str = string.ascii_letters + string.digits
    length: int = MIN_LENGTH
    prefix: str = ""
    decoded: bool = False
    check: Callable[[str], bool] = url_safe
    reader: str = "its service"
    why: str = "letters, digits, - and _"
    keep_stored: bool = False
    empty_is_own: bool = False

    def generate(self) -> str:
        if self.decoded:
            return base64.urlsafe_b64encode(random.token_bytes(self.length)).rstrip(b"=").decode()
        return self.prefix + "".join(random.choice(self.alphabet) for _ in range(self.length))

    def describe(self) -> str:
        if self.decoded:
            return f"{self.length} random bytes as unpadded base64url"
        return f"{self.prefix!r} and " * bool(self.prefix) + f"{self.length} characters of [{_classes(self.alphabet)}]"


def _classes(alphabet: str) -> str:
    return "".join(c for c, chars in (("a-z", string.ascii_lowercase), ("A-Z", string.ascii_uppercase),
                                       ("0-9", string.digits)) if set(chars) <= set(alphabet))


def rule_of(default: str, **given) -> Rule:
    """The rule read off a public default: its prefix (`sk-`), the classes of letters and digits
    it uses, its length (at least MIN_LENGTH). Punctuation is left out (`+` and `/` break URLs)."""
    prefix = re.match(r"^(?:[a-z]{2,3}-)?", default).group(0)
    body = default[len(prefix):]
    alphabet = "".join(chars for chars in (string.ascii_lowercase, string.ascii_uppercase, string.digits)
                       if any(c in chars for c in body)) or string.ascii_letters + string.digits
    return Rule(**{"alphabet": alphabet, "length": max(len(body), MIN_LENGTH), "prefix": prefix, **given})


class PublicDefault(str):
    """A public default secret (a str), with the rule its consumer checks when a preset knows it."""
    rule: Optional[Rule]

    def __new__(cls, value: str, rule: Optional[Rule] = None):
        text = super().__new__(cls, value)
        text.rule = rule
        return text


def rule_for(default: str) -> Rule:
    return getattr(default, "rule", None) or rule_of(default)

"""Generated secrets in place of public defaults.

Some projects ship secrets everybody knows (Dify's `DB_PASSWORD=difyai123456`). On a shared node
every user reaches every loopback address, so those must go. Presets list the variables and
their public defaults (``adapters.PRESET_SECRETS``). A variable that is unset, set to its public
default, or set to a placeholder that means "must be set" (`replace-with-...`, `your-...-here`,
`changeme`) gets a random value, kept 0600 in the output directory (``secrets.env``) and reused on
the next convert. The values reach the project through interpolation (the project is loaded again
with them in its environment, as if the user had set them), and any public default or placeholder
left over in a value (an env_file line such as `CELERY_BROKER_URL=redis://:difyai123456@redis:6379/1`)
is replaced too.

A generated value has the shape of the default it replaces, because the service that reads it may
check that shape: a ``PublicDefault`` may carry the ``Rule`` its consumer checks (Dify's agent
server decodes its key as base64url of exactly 32 bytes); otherwise the rule is read off the
default (its prefix, its letters and digits, at least its length). Generated values use letters,
digits, `-` and `_` only, so they are safe inside URLs (`redis://:PASSWORD@redis:6379/1`), YAML and
shell words. A stored value is reused unless it fails its consumer's check.
"""
from __future__ import annotations

import base64
import os
import re
import secrets as random
import string
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

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


class Chosen(Dict[str, str]):
    """The generated value of each variable, with the lines convert prints about them (``notes``)
    and the placeholders they replace (placeholder text -> variable)."""

    def __init__(self):
        super().__init__()
        self.notes: List[str] = []
        self.placeholders: Dict[str, str] = {}


def choose(table: Dict[str, str], environment: Dict[str, str], stored: Dict[str, str]) -> Chosen:
    """The generated value of every variable left at its public default, unset, or a placeholder."""
    chosen = Chosen()
    for variable, default in sorted(table.items()):
        rule = rule_for(default)
        value = environment.get(variable)
        placeholder = bool(value) and PLACEHOLDER.fullmatch(value.strip()) is not None
        if value == "" and rule.empty_is_own:
            continue
        if value and value != default and not placeholder:
            if not rule.check(value):
                chosen.notes.append(f"{variable} is set to a value {rule.reader} will refuse (it needs {rule.why}); "
                                    "set another one, or remove it and convert again for a generated one")
            continue
        kept = stored.get(variable)
        if kept and (rule.keep_stored or rule.check(kept)):
            chosen[variable] = kept
        else:
            if kept:
                chosen.notes.append(f"{variable}: the value generated by an earlier convert fails {rule.reader}'s "
                                    f"check (it needs {rule.why}); a new one replaces it in {SECRETS_FILE}")
            chosen[variable] = rule.generate()
        if placeholder:
            chosen.placeholders[value] = variable
            chosen.notes.append(f"{variable} is set to a placeholder, which means it must be set: compose2sif "
                                f"generated a value ({rule.describe()}), kept in {SECRETS_FILE}")
    return chosen


def file_text(chosen: Dict[str, str]) -> str:
    lines = ["# compose2sif: generated in place of public default secrets; reused by every convert"]
    return "\n".join(lines + [f"{k}={v}" for k, v in sorted(chosen.items())]) + "\n"


class Replacer:
    """Replaces public defaults left in values by the generated secret of their variable. A default
    shared by several variables (Dify's DB and Redis passwords) goes to the one whose name the
    text's context names (`redis://...` -> REDIS_PASSWORD), else to the first."""

    def __init__(self, table: Dict[str, str], chosen: Dict[str, str]):
        self.by_default: Dict[str, List[Tuple[str, str]]] = {}
        for variable, default in sorted(table.items()):
            if variable in chosen and default:
                self.by_default.setdefault(str(default), []).append((variable, chosen[variable]))
        for placeholder, variable in sorted(getattr(chosen, "placeholders", {}).items()):
            self.by_default.setdefault(placeholder, []).append((variable, chosen[variable]))
        self.notes: List[str] = list(getattr(chosen, "notes", []))
        # short defaults ("dify-sandbox" is also an image name) are replaced only as whole values
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

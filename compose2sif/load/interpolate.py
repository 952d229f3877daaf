"""Variable interpolation exactly as Docker Compose does it.

Forms: ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?err}``, ``${VAR?err}``,
``${VAR:+alt}``, ``${VAR+alt}``, nested defaults and ``$$`` for a literal dollar. The matching
follows compose-go's template package, quirks included, so a value resolves here as it does there.
Values at typed paths (``ports.*.target``, ``healthcheck.retries``...) are cast like Compose casts them.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from compose2sif.errors import ComposeError

Lookup = Callable[[str], Optional[str]]

_PATTERN = re.compile(
    r"\$(?:(?P<escaped>\$)|(?P<named>[_a-zA-Z][_a-zA-Z0-9]*)"
    r"|\{(?:(?P<braced>[_a-zA-Z][_a-zA-Z0-9]*(?::?[-+?](.*))?)\}|(?P<invalid>)))",
)
_OPERATORS = (":?", "?", ":-", "-", ":+", "+")


class InterpolationError(Exception):
    pass


class MissingRequired(InterpolationError):
    def __init__(self, variable: str, reason: str):
        self.variable, self.reason = variable, reason
        msg = f"required variable {variable} is missing a value"
        super().__init__(f"{msg}: {reason}" if reason else msg)


class InvalidTemplate(InterpolationError):
    pass


def _first_brace_closing(s: str) -> int:
    depth = 0
    i = 0
    while i < len(s):
        if s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        if s[i] == "{":
            depth += 1
            i += 1
        i += 1
    return -1


def _operator_for(template: str) -> str:
    """The operator that appears first in the matched text (compose-go sorts them by index)."""
    best, best_index = _OPERATORS[0], -1
    for op in _OPERATORS:
        index = template.find(op)
        if index >= 0 and (best_index < 0 or index < best_index):
            best, best_index = op, index
    return best


def _apply(op: str, substitution: str, lookup: Lookup) -> Tuple[str, bool]:
    if op not in substitution:
        return "", False
    name, arg = substitution.split(op, 1)
    # Docker Compose 2.40 interpolates the default/alternative/message before it looks at the
    # variable, so an error inside an unused default still fails the load. We do the same.
    arg = substitute(arg, lookup)
    value = lookup(name)
    if op in (":-", "-"):
        if value is None or (op == ":-" and value == ""):
            return arg, True
        return value, True
    if op in (":+", "+"):
        if value is not None and (op == "+" or value != ""):
            return arg, True
        return value or "", True
    # ":?" and "?"
    if value is None or (op == ":?" and value == ""):
        raise MissingRequired(name, arg)
    return value, True


def substitute(template: str, lookup: Lookup, unset: Optional[Callable[[str], None]] = None) -> str:
    """Interpolate one string. Raises InvalidTemplate or MissingRequired. ``unset`` is told the
    name of each variable that is used without a default and not set (Compose warns about those)."""
    if "$" not in template:
        return template

    def replace(match: "re.Match[str]") -> str:
        text = match.group(0)
        op = _operator_for(text)
        closing = _first_brace_closing(text)
        rest = ""
        if closing > -1:
            text, rest = text[:closing + 1], text[closing + 1:]
        m = _PATTERN.match(text)
        if m is None:
            raise InvalidTemplate(template)
        if m.group("escaped"):
            return "$"
        name = m.group("named")
        braced = False
        if not name:
            name = m.group("braced")
            braced = True
        if not name:
            raise InvalidTemplate(template)
        if braced:
            value, applied = _apply(op, name, lookup)
            if applied:
                return value + substitute(rest, lookup, unset)
        value = lookup(name)
        if value is None:
            if unset is not None:
                unset(name)
            return ""
        return value

    return _PATTERN.sub(replace, template)


def _to_bool(value: str):
    lowered = value.lower()
    if lowered in ("true", "y", "yes", "on"):
        return True
    if lowered in ("false", "n", "no", "off"):
        return False
    raise ValueError(f"invalid boolean: {value}")


def _to_int(value: str):
    if not re.fullmatch(r"[-+]?[0-9]+", value):
        raise ValueError(f'strconv.Atoi: parsing "{value}": invalid syntax')
    return int(value)


def _to_float(value: str):
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|[-+]?(?i:inf|infinity|nan)", value):
        raise ValueError(f'strconv.ParseFloat: parsing "{value}": invalid syntax')
    return float(value)


# compose-go's interpolateTypeCastMapping: paths under services.<name>, "*" any key, "[]" a list item.
_SERVICE_CASTS = {
    ("cpu_count",): _to_int, ("cpu_percent",): _to_float, ("cpu_period",): _to_int,
    ("cpu_quota",): _to_int, ("cpu_rt_period",): _to_int, ("cpu_rt_runtime",): _to_int,
    ("cpus",): _to_float, ("cpu_shares",): _to_int, ("init",): _to_bool,
    ("depends_on", "*", "required"): _to_bool, ("depends_on", "*", "restart"): _to_bool,
    ("deploy", "replicas"): _to_int, ("deploy", "update_config", "parallelism"): _to_int,
    ("deploy", "update_config", "max_failure_ratio"): _to_float,
    ("deploy", "rollback_config", "parallelism"): _to_int,
    ("deploy", "rollback_config", "max_failure_ratio"): _to_float,
    ("deploy", "restart_policy", "max_attempts"): _to_int,
    ("deploy", "placement", "max_replicas_per_node"): _to_int,
    ("healthcheck", "retries"): _to_int, ("healthcheck", "disable"): _to_bool,
    ("oom_kill_disable",): _to_bool, ("oom_score_adj",): _to_int, ("pids_limit",): _to_int,
    ("ports", "[]", "target"): _to_int, ("privileged",): _to_bool, ("read_only",): _to_bool,
    ("scale",): _to_int, ("stdin_open",): _to_bool, ("tty",): _to_bool,
    ("ulimits", "*"): _to_int, ("ulimits", "*", "hard"): _to_int, ("ulimits", "*", "soft"): _to_int,
    ("volumes", "[]", "read_only"): _to_bool, ("volumes", "[]", "volume", "nocopy"): _to_bool,
}
_CASTS = {("services", "*") + k: v for k, v in _SERVICE_CASTS.items()}
for _kind in ("networks", "volumes", "secrets", "configs"):
    _CASTS[(_kind, "*", "external")] = _to_bool
for _flag in ("internal", "attachable", "enable_ipv4", "enable_ipv6"):
    _CASTS[("networks", "*", _flag)] = _to_bool


def path_matches(path: Tuple[str, ...], pattern: Tuple[str, ...]) -> bool:
    return len(path) == len(pattern) and all(p == "*" or p == q for p, q in zip(pattern, path))


class PathTable:
    """Patterns of compose paths (``"*"`` matches any one key) to values, looked up as a trie: the
    loader asks once per node of every document, so a scan of all patterns each time is too slow.
    ``get`` returns the value of the first pattern (in the given order) that matches ``path``."""

    def __init__(self, patterns: Dict[Tuple[str, ...], Any]):
        self._root: Dict[str, Any] = {}
        for order, (pattern, value) in enumerate(patterns.items()):
            node = self._root
            for part in pattern:
                node = node.setdefault(part, {})
            node.setdefault(None, (order, value))  # None: a pattern ends here

    def start(self) -> List[Dict[str, Any]]:
        """Where a walk from the top of a document begins; ``step`` moves it one key down."""
        return [self._root]

    @staticmethod
    def step(nodes: List[Dict[str, Any]], part: str) -> List[Dict[str, Any]]:
        return [child for node in nodes for child in (node.get(part), node.get("*")) if child is not None]

    @staticmethod
    def value_at(nodes: List[Dict[str, Any]], default: Any = None) -> Any:
        ends = [node[None] for node in nodes if None in node]
        return min(ends, key=lambda end: end[0])[1] if ends else default

    def _nodes(self, path: Tuple[str, ...]):
        nodes = [self._root]
        for part in path:
            nodes = self.step(nodes, part)
            if not nodes:
                break
        return nodes

    def get(self, path: Tuple[str, ...], default: Any = None) -> Any:
        return self.value_at(self._nodes(path), default)

    def leads_somewhere(self, path: Tuple[str, ...]) -> bool:
        """Whether some pattern is ``path`` or lies below it."""
        return bool(self._nodes(path))


def dotted(path: Tuple[str, ...]) -> str:
    return ".".join(path).replace(".[]", "[]")


def interpolate_tree(tree: Dict[str, Any], lookup: Lookup,
                     unset: Optional[Callable[[str], None]] = None) -> Dict[str, Any]:
    """Interpolate every string value (not keys) of a compose document, casting typed paths."""

    def walk(value: Any, path: Tuple[str, ...], nodes: List[Dict[str, Any]]) -> Any:
        # `nodes`: where `path` is in the table of typed paths, carried down instead of looked up
        if isinstance(value, str):
            try:
                result = substitute(value, lookup, unset)
            except InvalidTemplate:
                raise ComposeError(f"invalid interpolation format {value!r}; "
                                   "you may need to escape any $ with another $", path=dotted(path)) from None
            except MissingRequired as exc:
                raise ComposeError(str(exc), path=dotted(path)) from None
            cast = PathTable.value_at(nodes) if nodes else None
            if cast is None:
                return result
            try:
                return cast(result)
            except ValueError as exc:
                raise ComposeError(f"failed to cast to expected type: {exc}", path=dotted(path)) from None
        if isinstance(value, dict):
            return {k: walk(v, path + (str(k),), PathTable.step(nodes, str(k)) if nodes else nodes)
                    for k, v in value.items()}
        if isinstance(value, list):
            below = PathTable.step(nodes, "[]") if nodes else nodes
            return [walk(v, path + ("[]",), below) for v in value]
        if hasattr(value, "value") and not isinstance(value, (int, float)):  # !override wrapper
            value.value = walk(value.value, path, nodes)
        return value

    top = _CAST_TABLE.start()
    return {k: walk(v, (k,), PathTable.step(top, str(k))) for k, v in tree.items()}


_CAST_TABLE = PathTable(_CASTS)

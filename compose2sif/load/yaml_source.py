"""Read compose YAML the way Docker Compose's Go YAML library does.

PyYAML implements YAML 1.1, where ``22:22`` is the number 1342 and ``yes`` is true. Compose reads
YAML 1.2-style: only true/false are booleans, ``22:22`` stays a string, ``010`` is octal, dates are
timestamps. We keep PyYAML's parser (anchors, aliases, ``<<`` merge keys) and resolve plain
scalars with Compose's rules. The ``!reset`` and ``!override`` tags become markers for the merge
stage, and each document keeps the line of every key so errors can point into the file.
"""
from __future__ import annotations

import datetime
import re
from typing import Any, Dict, List, NamedTuple, Tuple

import yaml

from compose2sif.errors import ComposeError

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Reset:
    """A value tagged ``!reset``: removes what earlier files set at this path."""

    def __repr__(self) -> str:
        return "!reset"


class Override:
    """A value tagged ``!override``: replaces, instead of merging with, what earlier files set."""
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Override) and other.value == self.value

    def __repr__(self) -> str:
        return f"!override {self.value!r}"


class Timestamp(str):
    """A plain scalar that Compose's YAML reader turns into a time value (invalid almost everywhere)."""


_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_TIMESTAMP = re.compile(r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
                        r"(?:(?:[Tt]|[ \t]+)[0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(?:\.[0-9]*)?"
                        r"(?:[ \t]*(?:Z|[-+][0-9]{1,2}(?::[0-9]{2})?))?)?$")
_NULLS = {"", "~", "null", "Null", "NULL"}
_BOOLS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_SPECIAL_FLOATS = {".inf": float("inf"), ".Inf": float("inf"), ".INF": float("inf"),
                   "+.inf": float("inf"), "+.Inf": float("inf"), "+.INF": float("inf"),
                   "-.inf": float("-inf"), "-.Inf": float("-inf"), "-.INF": float("-inf"),
                   ".nan": float("nan"), ".NaN": float("nan"), ".NAN": float("nan")}


def _go_parse_int(text: str):
    """strconv.ParseInt(text, 0, 64): decimal, 0x, 0o, 0b and a leading 0 for octal."""
    sign = 1
    body = text
    if body and body[0] in "+-":
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if not body:
        return None
    lower = body.lower()
    try:
        if lower.startswith("0x"):
            return sign * int(body[2:], 16)
        if lower.startswith("0o"):
            return sign * int(body[2:], 8)
        if lower.startswith("0b"):
            return sign * int(body[2:], 2)
        if body.startswith("0") and len(body) > 1:
            return sign * int(body[1:], 8)
        if body.isdigit():
            return sign * int(body)
    except ValueError:
        return None
    return None


def resolve_plain_scalar(text: str) -> Any:
    """The value Compose's YAML reader gives an unquoted scalar."""
    if text in _NULLS:
        return None
    if text in _BOOLS:
        return _BOOLS[text]
    if text in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[text]
    first = text[0]
    if first.isdigit() or first in "+-.":
        if _TIMESTAMP.match(text):
            return Timestamp(text)
        plain = text.replace("_", "")
        number = _go_parse_int(plain)
        if number is not None and -(1 << 63) <= number < (1 << 64):
            return number
        if _FLOAT.match(plain):
            return float(plain)
    return text


class _ComposeLoader(_BaseLoader):
    pass


_ComposeLoader.yaml_implicit_resolvers = {}
_ComposeLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])


def _construct_str(loader, node):
    if not node.style:  # plain (None in PyYAML's parser, '' in libyaml's)
        return resolve_plain_scalar(node.value)
    return node.value


def _construct_mapping(loader, node):
    loader.flatten_mapping(node)
    seen: Dict[Any, int] = {}
    mapping: Dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (dict, list)):
            raise ComposeError("a mapping key must be a plain value", line=key_node.start_mark.line + 1)
        if key in seen and not getattr(key_node, "_merged", False):
            raise ComposeError(f"mapping key {key!r} already defined at line {seen[key]}",
                               line=key_node.start_mark.line + 1)
        seen[key] = key_node.start_mark.line + 1
        mapping[key] = loader.construct_object(value_node, deep=True)
    return mapping


def _flatten_mapping(self, node):
    """Like PyYAML's, but keys that come from a ``<<`` merge may be overridden without an error."""
    merged_pairs = []
    own_pairs = []
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if not isinstance(source, yaml.MappingNode):
                    raise ComposeError("a '<<' merge key must name a mapping", line=source.start_mark.line + 1)
                self.flatten_mapping(source)
                for pair in source.value:
                    merged_pairs.append(pair)
        else:
            own_pairs.append((key_node, value_node))
    if merged_pairs:
        own_keys = {k.value for k, _ in own_pairs if isinstance(k, yaml.ScalarNode)}
        kept, taken = [], set()
        # Go's YAML merge: explicit keys win, then the first merged mapping that sets a key.
        for key_node, value_node in merged_pairs:
            if key_node.value in own_keys or key_node.value in taken:
                continue
            taken.add(key_node.value)
            marked = yaml.ScalarNode(key_node.tag, key_node.value, key_node.start_mark, key_node.end_mark,
                                     style=key_node.style)
            marked._merged = True
            kept.append((marked, value_node))
        node.value = kept + own_pairs


_ComposeLoader.flatten_mapping = _flatten_mapping


def _construct_tagged(kind):
    def construct(loader, node):
        if isinstance(node, yaml.MappingNode):
            value = _construct_mapping(loader, node)
        elif isinstance(node, yaml.SequenceNode):
            value = [loader.construct_object(child, deep=True) for child in node.value]
        else:
            value = _construct_str(loader, node)
        return Reset() if kind == "reset" else Override(value)
    return construct


def _construct_timestamp(loader, node):
    return Timestamp(node.value)


_ComposeLoader.add_constructor("tag:yaml.org,2002:str", _construct_str)
_ComposeLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_ComposeLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)
_ComposeLoader.add_constructor("!reset", _construct_tagged("reset"))
_ComposeLoader.add_constructor("!override", _construct_tagged("override"))


def _unshare(value):
    """Copy a tree so aliased nodes become independent values (as Go's decoder makes them)."""
    if isinstance(value, dict):
        return {k: _unshare(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unshare(v) for v in value]
    if isinstance(value, Override):
        return Override(_unshare(value.value))
    return value


Path = Tuple[str, ...]


def _check_keys(value: Any, path: str, lines: Dict[Path, int]) -> None:
    """Compose accepts only string keys, in extensions too (`8000:` must be written `"8000":`)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or isinstance(key, Timestamp):
                parts = tuple(path.split(".")) if path else ()
                line = next((lines[parts[:n]] for n in range(len(parts), 0, -1) if parts[:n] in lines), None)
                raise ComposeError(f"non-string key in {path or 'the top level'}: {key} (quote it)", line=line)
            _check_keys(item, f"{path}.{key}" if path else key, lines)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_keys(item, f"{path}[{i}]", lines)
    elif isinstance(value, Override):
        _check_keys(value.value, path, lines)


def _record_lines(node, path: Path, lines: Dict[Path, int], depth: int) -> None:
    if depth == 0 or not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode):
            sub = path + (key_node.value,)
            lines.setdefault(sub, key_node.start_mark.line + 1)
            _record_lines(value_node, sub, lines, depth - 1)


class Document(NamedTuple):
    """One YAML document of a compose file, with the line where each key (4 levels deep) starts."""
    filename: str
    data: Dict[str, Any]
    lines: Dict[Path, int]

    def line_of(self, *path: str):
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None


def load_documents(filename: str, text: str) -> List[Document]:
    """Parse every YAML document in a compose file. Raises ComposeError with the file and line."""
    loader = _ComposeLoader(text)
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            lines: Dict[Path, int] = {}
            _record_lines(node, (), lines, 4)
            _check_aliasing(node)
            data = loader.construct_document(node)
            if data is None:
                continue
            if not isinstance(data, dict):
                raise ComposeError("top-level object must be a mapping",
                                   line=node.start_mark.line + 1)
            _check_keys(data, "", lines)
            documents.append(Document(filename, _unshare(data), lines))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(filter(None, [exc.context, exc.problem]))
        raise ComposeError(f"invalid YAML: {problem}", file=filename,
                           line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ComposeError(f"invalid YAML: {exc}", file=filename) from None
    except ComposeError as exc:
        raise exc.located(filename, exc.line) from None
    finally:
        loader.dispose()
    return documents


# Go's YAML decoder (yaml.v3, which compose-go uses) refuses a billion-laughs document while decoding: once
# more than 100 of more than 1000 decoded nodes came through aliases, their share may be at most 99% up to
# 400,000 decoded nodes, falling linearly to 10% at 4,000,000.
_ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH = 400_000, 4_000_000


def _allowed_alias_ratio(decoded: int) -> float:
    if decoded <= _ALIAS_RATIO_LOW:
        return 0.99
    if decoded >= _ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_RATIO_LOW) / (_ALIAS_RATIO_HIGH - _ALIAS_RATIO_LOW)


def _children(node) -> List[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_aliasing(root) -> None:
    """Count the nodes Go's decoder would decode, in its order, without expanding anything (an alias
    is the very node object it names); refuse as it does. The ratio only rises within one alias's
    expansion while the allowed ratio only falls, so checking at the end of each is enough."""
    expanded: Dict[int, int] = {}   # id(node) -> nodes decoded for it, aliases expanded

    def size(node) -> int:
        stack = [(node, False)]
        while stack:
            current, done = stack.pop()
            if id(current) in expanded:
                continue
            if done:
                expanded[id(current)] = 1 + sum(expanded[id(c)] for c in _children(current))
            else:
                stack.append((current, True))
                stack.extend((c, False) for c in _children(current) if id(c) not in expanded)
        return expanded[id(node)]

    seen: set = set()
    decoded = aliased = 0
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:  # an alias: all of its target again
            target = size(node)
            decoded, aliased = decoded + 1 + target, aliased + target
            if aliased > 100 and decoded > 1000 and aliased / decoded > _allowed_alias_ratio(decoded):
                raise ComposeError("yaml: document contains excessive aliasing", line=node.start_mark.line + 1)
            continue
        seen.add(id(node))
        decoded += 1
        stack.extend(reversed(_children(node)))


def is_timestamp(value: Any) -> bool:
    return isinstance(value, (Timestamp, datetime.date))

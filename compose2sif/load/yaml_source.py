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
    merges = False
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            merges = True
            if value_node.tag == "!reset":  # compose-go drops a `!reset` value, an alias to one too
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source in sources:
                if source.tag == "!reset":
                    continue
                if not isinstance(source, yaml.MappingNode):
                    raise ComposeError("a '<<' merge key must name a mapping", line=source.start_mark.line + 1)
                self.flatten_mapping(source)
                for pair in source.value:
                    merged_pairs.append(pair)
        else:
            own_pairs.append((key_node, value_node))
    if merges:  # `<<: {}` and `<<: []` merge nothing, and go too
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
        if kind == "reset":  # its value is never read (compose-go does not even walk it)
            return Reset()
        if isinstance(node, yaml.MappingNode):
            value = _construct_mapping(loader, node)
        elif isinstance(node, yaml.SequenceNode):
            value = [loader.construct_object(child, deep=True) for child in node.value]
        else:
            value = _construct_str(loader, node)
        return Override(value)
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
            _check_aliases(node, text)
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


# ---- YAML aliases: what Docker Compose accepts ------------------------------------------------------
#
# Docker Compose 2.40.3 reads a compose file with compose-go v2.9.1 (loader/loader.go:503-520): yaml.v3
# parses it into a node tree, compose-go's ResetProcessor (loader/reset.go:46-109) walks that tree from
# the top and puts in place of every alias the node it names (lines 54-60, after checkForCycle, lines
# 153-179), and only then does yaml.v3 decode the tree. Hence, and we do the same, without expanding:
#
# - There is no limit on how far aliases expand: yaml.v3's "document contains excessive aliasing" never
#   sees the aliases ResetProcessor replaced. A billion-laughs file loads, in time and memory that grow
#   with its expansion. We stop at MAX_EXPANDED_NODES (docs/loader.md says why that number).
# - checkForCycle refuses an alias to a node already reached through an alias at a path that contains,
#   or lies within, this alias's path: "cycle detected: node at path P references node at path Q".
#   That catches a value that contains itself, but also refuses one anchor merged (`<<: *x`) or aliased
#   at a path and again below it (`a: {<<: *x, build: {<<: *x}}`). Paths drop the first `.<<` at
#   each step and a path with `<<` left in it is never compared, so a value that contains itself
#   through merge keys alone goes unnoticed: compose-go recurses until it runs out of memory or stack.
# - Aliases ResetProcessor does not walk (inside a `!override` value, or a mapping key) reach yaml.v3's
#   decoder, which refuses a value that contains itself and applies its alias-ratio rule to them
#   (yaml.v3 decode.go:484-491). It counts a mapping's keys again when it merges; we count them once,
#   so near that ratio's bound we may be a few nodes off.

MAX_EXPANDED_NODES = 2_000_000
_REENTRIES = 8  # a node walked again inside itself this often without an error: compose-go never ends

# yaml.v3's decoder refuses once more than 100 of more than 1000 decoded nodes came through aliases and
# their share passes 99% up to 400,000 decoded nodes, falling linearly to 10% at 4,000,000.
_ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH = 400_000, 4_000_000
_ANCHOR = re.compile(r"(?:!\S*\s+)?&([^\s,\[\]{}]+)")


def _allowed_alias_ratio(decoded: int) -> float:
    if decoded <= _ALIAS_RATIO_LOW:
        return 0.99
    if decoded >= _ALIAS_RATIO_HIGH:
        return 0.10
    return 0.99 - 0.89 * (decoded - _ALIAS_RATIO_LOW) / (_ALIAS_RATIO_HIGH - _ALIAS_RATIO_LOW)


def _excessive(aliased: int, before: int, after: int) -> bool:
    """Whether yaml.v3 refuses at some count in (before, after] while `aliased` stays the same. Its
    margin is convex between the ratio's bends, so the ends of each piece are enough."""
    if aliased <= 100:
        return False
    points = (after, before + 1, 1001, _ALIAS_RATIO_LOW, _ALIAS_RATIO_HIGH)
    return any(before < d <= after and d > 1000 and aliased / d > _allowed_alias_ratio(d) for d in points)


def _children(node) -> List[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _alias_edges(root) -> set:
    """(id(parent), position) of each child that is an alias. PyYAML gives an alias the very node it
    names; that node's first place in document order is where its anchor stands."""
    seen = {id(root)}
    aliases = set()
    stack = [(id(root), i, child) for i, child in reversed(list(enumerate(_children(root))))]
    while stack:
        parent, position, node = stack.pop()
        if id(node) in seen:
            aliases.add((parent, position))
            continue
        seen.add(id(node))
        children = _children(node)
        stack.extend((id(node), i, children[i]) for i in range(len(children) - 1, -1, -1))
    return aliases


def _anchor_name(node, text: str) -> str:
    try:
        found = _ANCHOR.match(text, node.start_mark.index)
    except (AttributeError, TypeError):
        found = None
    return found.group(1) if found else "?"


class _ReachedAt:
    """checkForCycle's record of one node: the paths it was reached at through an alias, in a tree of
    their dot-separated parts. Each place keeps the first path ending there and the first path going on
    below it, as checkForCycle's loop reports the first path that contains, or lies within, a new one."""
    __slots__ = ("paths", "root")

    def __init__(self) -> None:
        self.paths: List[str] = []
        self.root: list = [None, None, {}]  # [first path ending here, first path going below, parts below]

    def conflict(self, path: str):
        """The first recorded path that is a dot-prefix of PATH, or has PATH as one."""
        if "<<" in path:
            return None
        found = []
        place = self.root
        parts = path.split(".")
        for depth, part in enumerate(parts):
            place = place[2].get(part)
            if place is None:
                break
            if depth < len(parts) - 1 and place[0] is not None:
                found.append(place[0])
            if depth == len(parts) - 1 and place[1] is not None:
                found.append(place[1])
        return self.paths[min(found)] if found else None

    def add(self, path: str) -> None:
        if "<<" in path:  # never compared, either way
            return
        index = len(self.paths)
        self.paths.append(path)
        place = self.root
        parts = path.split(".")
        for depth, part in enumerate(parts):
            place = place[2].setdefault(part, [None, None, {}])
            slot = 0 if depth == len(parts) - 1 else 1
            if place[slot] is None:
                place[slot] = index


def _next_path(path: str, part: str) -> str:
    """tree.Path.Next, as Path.String() prints it (a dot inside a key stays a dot)."""
    return part if path == "" else f"{path}.{part}"


def _resolve_resets(root, aliases: set, text: str) -> set:
    """Walk the document as ResetProcessor.resolveReset walks it, raising its errors; return the ids of
    the nodes it walked (their aliases then replaced by what they name). A node's aliases are replaced
    once its walk ends, so walking it again finds none: that walk is skipped, as it changes nothing."""
    walked: set = set()
    busy: Dict[int, int] = {}
    reached: Dict[int, _ReachedAt] = {}
    reentries: List[Tuple[str, int]] = []  # where a node was entered again inside itself
    stack: List[list] = []  # [node, path, position in node's children]

    def enter(node, path: str, alias: bool, line: int) -> None:
        path = path.replace(".<<", "", 1)
        if alias:
            record = reached.setdefault(id(node), _ReachedAt())
            earlier = record.conflict(path)
            if earlier is not None:
                raise ComposeError(f"cycle detected: node at path {path} references node at path {earlier}",
                                   line=line)
            record.add(path)
            path = path.replace(".<<", "", 1)
        if node.tag in ("!reset", "!override") or isinstance(node, yaml.ScalarNode) or id(node) in walked:
            return
        if busy.get(id(node)):
            reentries.append((path, line))
            if len(reentries) > _REENTRIES:
                path, line = reentries[0]
                raise ComposeError(f"the value at path {path} contains itself through aliases; Docker Compose "
                                   "does not detect this cycle and recurses until it runs out of memory", line=line)
        busy[id(node)] = busy.get(id(node), 0) + 1
        stack.append([node, path, 0])

    enter(root, "", False, root.start_mark.line + 1)
    while stack:
        frame = stack[-1]
        node, path, position = frame
        if isinstance(node, yaml.SequenceNode) and position < len(node.value):
            frame[2] += 1
            enter(node.value[position], _next_path(path, str(position)), (id(node), position) in aliases,
                  node.start_mark.line + 1)
        elif isinstance(node, yaml.MappingNode) and position < len(node.value):
            frame[2] += 1
            key, value = node.value[position]
            if (id(node), 2 * position) in aliases:
                name = _anchor_name(key, text)
            else:
                name = key.value if isinstance(key, yaml.ScalarNode) else ""
            enter(value, _next_path(path, name), (id(node), 2 * position + 1) in aliases, key.start_mark.line + 1)
        else:
            stack.pop()
            busy[id(node)] -= 1
            walked.add(id(node))
    return walked


def _decoded_children(node, aliases: set, walked: set) -> List[Tuple[Any, bool]]:
    """(child, whether yaml.v3 meets it as an alias), in the order it decodes them: a mapping's `<<`
    value after its other keys. ResetProcessor left no alias below a node it walked but keys, nor a
    `!reset` value."""
    children = _children(node)
    walked_here = id(node) in walked
    if isinstance(node, yaml.SequenceNode):
        if walked_here:
            return [(child, False) for child in children if child.tag != "!reset"]
        return [(child, (id(node), i) in aliases) for i, child in enumerate(children)]
    pairs: List[Tuple[Any, bool]] = []
    merges: List[Tuple[Any, bool]] = []
    for i in range(0, len(children), 2):
        key, value = children[i], children[i + 1]
        if walked_here and value.tag == "!reset":
            continue
        pair = [(key, (id(node), i) in aliases), (value, not walked_here and (id(node), i + 1) in aliases)]
        (merges if key.tag == "tag:yaml.org,2002:merge" else pairs).extend(pair)
    return pairs + merges


def _refuse_loop(loop: List[list], closing_alias: bool, start, under_alias: bool, through_alias: set,
                 text: str) -> None:
    """yaml.v3 decodes round a loop: LOOP's frames from the node it starts at, CLOSING_ALIAS whether
    the edge back to START is an alias, UNDER_ALIAS whether an alias led to the loop."""
    edges = [(frame[3], frame[0]) for frame in loop[1:]] + [(closing_alias, start)]
    target = next((node for alias, node in edges if alias), None)
    line = start.start_mark.line + 1
    if target is not None:  # the second time round it enters that alias again
        raise ComposeError(f"yaml: anchor '{_anchor_name(target, text)}' value contains itself", line=line)
    aside = any(alias or id(child) in through_alias for frame in loop for child, alias in frame[1][:frame[2] - 1])
    if under_alias or aside:  # aliases decoded each time round: their share passes the ratio that falls to 10%
        raise ComposeError("yaml: document contains excessive aliasing", line=line)
    raise ComposeError(f"the value at line {line} contains itself through aliases; Docker Compose recurses on "
                       "it until it runs out of stack", line=line)


def _check_aliases(root, text: str) -> None:
    """Refuse what Docker Compose refuses about aliases, and a document that expands beyond
    MAX_EXPANDED_NODES, counting without expanding (each node's expansion once)."""
    aliases = _alias_edges(root)
    if not aliases:
        return
    walked = _resolve_resets(root, aliases, text)
    size: Dict[int, int] = {}   # id(node) -> nodes yaml.v3 decodes for it
    through_alias: set = set()  # ids of the nodes whose decoding meets an alias
    place: Dict[int, int] = {id(root): 0}  # id(node) -> its frame in the chain being decoded
    chain = [[root, _decoded_children(root, aliases, walked), 0, False]]  # node, children, next, via an alias
    while chain:
        frame = chain[-1]
        node, children, position, _ = frame
        if position < len(children):
            frame[2] += 1
            child, alias = children[position]
            if id(child) in size:
                continue
            if id(child) in place:
                start = place[id(child)]
                _refuse_loop(chain[start:], alias, child, any(f[3] for f in chain[:start + 1]), through_alias,
                             text)
            place[id(child)] = len(chain)
            chain.append([child, _decoded_children(child, aliases, walked), 0, alias])
            continue
        chain.pop()
        del place[id(node)]
        size[id(node)] = 1 + sum(size[id(child)] + alias for child, alias in children)
        if any(alias or id(child) in through_alias for child, alias in children):
            through_alias.add(id(node))
    if size[id(root)] > MAX_EXPANDED_NODES:
        raise ComposeError(f"aliases expand this document to {size[id(root)]:,} YAML nodes; compose2sif reads at "
                           f"most {MAX_EXPANDED_NODES:,} (Docker Compose takes minutes and gigabytes beyond that)")
    decoded = aliased = 0
    pending = [(root, False)]
    while pending:
        node, alias = pending.pop()
        if alias or id(node) not in through_alias:
            step = 1 if alias else size[id(node)]
            if _excessive(aliased, decoded, decoded + step):
                raise ComposeError("yaml: document contains excessive aliasing", line=node.start_mark.line + 1)
            decoded += step
            if alias:
                decoded, aliased = decoded + size[id(node)], aliased + size[id(node)]
                if _excessive(aliased, decoded - 1, decoded):
                    raise ComposeError("yaml: document contains excessive aliasing", line=node.start_mark.line + 1)
            continue
        if _excessive(aliased, decoded, decoded + 1):
            raise ComposeError("yaml: document contains excessive aliasing", line=node.start_mark.line + 1)
        decoded += 1
        pending.extend(reversed(_decoded_children(node, aliases, walked)))


def is_timestamp(value: Any) -> bool:
    return isinstance(value, (Timestamp, datetime.date))

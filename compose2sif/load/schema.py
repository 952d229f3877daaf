"""Validation by the Compose Specification's JSON schema, as Docker Compose validates every file.

The schema is the one Compose v2.40.3 embeds (spec/compose-spec.json, with its provenance in spec/README.md).
It uses a small part of JSON Schema (draft 07): type, enum, pattern, minimum, maximum, properties,
patternProperties, additionalProperties, required, items, uniqueItems, oneOf, $ref. This module interprets
exactly those, so that `config` imports nothing more than the json module (a general validator costs more
to import than the whole of `config` takes on a small project).

Errors are worded and chosen as compose-go chooses them (schema/schema.go): of all failures, the deepest in
the document wins (an `additionalProperties` failure counts one level deeper), the first one on a tie;
``services.web.deploy.resources additional properties 'foo' not allowed``.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from compose2sif.load.yaml_source import is_timestamp

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "spec", "compose-spec.json")

# (specificity, instance path, message[, path of the line to report]): the failure compose-go would report.
Failure = Tuple[Any, ...]

_schema: Dict[str, Any] = {}
_patterns: Dict[str, "re.Pattern[str]"] = {}


def _root() -> Dict[str, Any]:
    if not _schema:
        with open(SCHEMA_PATH, encoding="utf-8") as fh:
            _schema.update(json.load(fh))
    return _schema


def _pattern(text: str) -> "re.Pattern[str]":
    compiled = _patterns.get(text)
    if compiled is None:
        compiled = _patterns[text] = re.compile(text)
    return compiled


_refs: Dict[str, Dict[str, Any]] = {}


def _resolve(ref: str) -> Dict[str, Any]:
    node = _refs.get(ref)
    if node is None:
        node = _root()
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        _refs[ref] = node
    return node


def _json_type(value: Any) -> Optional[str]:
    if type(value) is str:  # the common case first (a Timestamp is a str subclass)
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return None if is_timestamp(value) else "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return None


def _type_name(want: List[str]) -> str:
    """compose-go's humanReadableType: object is a mapping; several types sorted, 'a, b or c'."""
    names = sorted("mapping" if w == "object" else w for w in want)
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _quote(value: Any) -> str:
    return f"'{value}'" if isinstance(value, str) else json.dumps(value)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _better(best: Optional[Failure], other: Optional[Failure]) -> Optional[Failure]:
    if other is None:
        return best
    return other if best is None or other[0] > best[0] else best


_TYPE_ONLY = {"type", "description", "deprecated"}
# id(schema) -> (allowed JSON types, the message when none is met) for a schema that only checks a type (or a
# oneOf of such schemas, whose failures all lie at the value itself: the first branch's is reported); else None.
_type_checks: Dict[int, Optional[Tuple[Tuple[str, ...], str]]] = {}


def _type_check(schema: Dict[str, Any]) -> Optional[Tuple[Tuple[str, ...], str]]:
    if "$ref" in schema:
        return _type_check(_resolve(schema["$ref"]))
    branches = schema.get("oneOf", [schema]) if set(schema) <= _TYPE_ONLY | {"oneOf"} else None
    if not branches or any("oneOf" in b or "$ref" in b or not set(b) <= _TYPE_ONLY or "type" not in b
                           for b in branches):
        return None
    wanted: Tuple[str, ...] = ()
    for branch in branches:
        wanted += tuple(branch["type"]) if isinstance(branch["type"], list) else (branch["type"],)
    first = branches[0]["type"]
    return wanted, f"must be a {_type_name(first if isinstance(first, list) else [first])}"


def _check(schema: Dict[str, Any], value: Any, path: Tuple[str, ...]) -> Optional[Failure]:
    """The most specific failure of ``value`` against ``schema``, or None when it is valid."""
    key = id(schema)
    if key not in _type_checks:
        _type_checks[key] = _type_check(schema)
    simple = _type_checks[key]
    if simple is not None:
        kind = _json_type(value)
        if kind in simple[0] or kind == "integer" and "number" in simple[0]:
            return None
        return len(path), path, simple[1] + ("" if kind else " (a date is not a string here: quote it)")
    ref = schema.get("$ref")
    if ref is not None:  # draft 07: a $ref's siblings are ignored (the schema has none but descriptions)
        return _check(_resolve(ref), value, path)
    want = schema.get("type")
    kind = _json_type(value)
    if want is not None:
        wanted = want if isinstance(want, list) else [want]
        if kind not in wanted and not (kind == "integer" and "number" in wanted):
            if kind is None:
                message = f"must be a {_type_name(wanted)} (a date is not a string here: quote it)"
            else:
                message = f"must be a {_type_name(wanted)}"
            return len(path), path, message
    best: Optional[Failure] = None
    if "enum" in schema and value not in schema["enum"]:
        best = _better(best, (len(path), path, "value must be one of " + ", ".join(map(_quote, schema["enum"]))))
    if kind == "string" and "pattern" in schema and not _pattern(schema["pattern"]).search(value):
        best = _better(best, (len(path), path, f"'{value}' does not match pattern '{schema['pattern']}'"))
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            best = _better(best, (len(path), path, f"must be greater than or equal to {_number(schema['minimum'])}"))
        if "maximum" in schema and value > schema["maximum"]:
            best = _better(best, (len(path), path, f"must be less than or equal to {_number(schema['maximum'])}"))
    if kind == "object":
        best = _better(best, _check_object(schema, value, path))
    elif kind == "array":
        best = _better(best, _check_array(schema, value, path))
    branches = schema.get("oneOf")
    if branches is not None:
        # The schema's oneOf branches never overlap (each is a different type or shape), so the first valid
        # branch is the only one.
        found: Optional[Failure] = None
        for branch in branches:
            failure = _check(branch, value, path)
            if failure is None:
                found = None
                break
            found = _better(found, failure)
        best = _better(best, found)
    return best


# id(schema) -> its properties, its patternProperties compiled, its additionalProperties
_object_checks: Dict[int, Tuple[Dict[str, Any], List[Tuple[Any, Dict[str, Any]]], Any]] = {}


def _object_check(schema: Dict[str, Any]) -> Tuple[Dict[str, Any], List[Tuple[Any, Dict[str, Any]]], Any]:
    found = _object_checks.get(id(schema))
    if found is None:
        patterns = [(_pattern(p).search, sub) for p, sub in (schema.get("patternProperties") or {}).items()]
        found = _object_checks[id(schema)] = (schema.get("properties") or {}, patterns,
                                              schema.get("additionalProperties", True))
    return found


def _check_object(schema: Dict[str, Any], value: Dict[Any, Any], path: Tuple[str, ...]) -> Optional[Failure]:
    best: Optional[Failure] = None
    required = [key for key in schema.get("required", ()) if key not in value]
    if required:
        noun = "property" if len(required) == 1 else "properties"
        best = (len(path), path, f"missing {noun} " + ", ".join(map(_quote, required)))
    properties, patterns, additional = _object_check(schema)
    extra: List[str] = []
    for key, item in value.items():
        key = str(key)
        matched = False
        sub = properties.get(key)
        if sub is not None:
            matched = True
            failure = _check(sub, item, path + (key,))
            if failure is not None:
                best = _better(best, failure)
        for search, sub in patterns:
            if search(key):
                matched = True
                if sub:  # `{}` (the extensions' schema) accepts anything
                    failure = _check(sub, item, path + (key,))
                    if failure is not None:
                        best = _better(best, failure)
        if not matched:
            if additional is False:
                extra.append(key)
            elif isinstance(additional, dict):
                best = _better(best, _check(additional, item, path + (key,)))
    if extra:
        # compose-go says "properties" even for one; the line reported is the first extra key's
        best = _better(best, (len(path) + 1, path, "additional properties " + ", ".join(map(_quote, extra)) +
                              " not allowed", path + (extra[0],)))
    return best


def _check_array(schema: Dict[str, Any], value: List[Any], path: Tuple[str, ...]) -> Optional[Failure]:
    best: Optional[Failure] = None
    items = schema.get("items")
    if isinstance(items, dict):
        for index, item in enumerate(value):
            best = _better(best, _check(items, item, path + (str(index),)))
    if schema.get("uniqueItems"):
        seen: Dict[Any, int] = {}
        for index, item in enumerate(value):
            key = _unique_key(item)
            if key in seen:
                best = _better(best, (len(path), path, f"items at {seen[key]} and {index} are equal"))
                break
            seen[key] = index
    return best


def _unique_key(item: Any) -> Any:
    """Equal for items JSON Schema holds equal (1 and 1.0, not 1 and true); cheap for scalars."""
    if isinstance(item, bool) or item is None:
        return ("b", item)
    if isinstance(item, (int, float)):
        return ("n", item)
    if isinstance(item, str):
        return ("s", str(item))
    return ("j", json.dumps(item, sort_keys=True, default=str))


def schema_failure(model: Dict[str, Any]) -> Optional[Failure]:
    """What Compose's schema rejects in ``model`` (a whole compose file, merged), or None."""
    return _check(_root(), model, ())

"""Fuzz of `convert` (load, plan, render) on projects drawn from the Compose Specification's own schema:
each service key gets a value of the shape the schema gives it (now and then one of another shape),
with hostile strings inside, and `x-compose2sif` gets the shapes the planner reads. Every project
converts or is refused with a ComposeError; any other exception is a crash ("internal error").

Seeded and bounded in time: C2S_FUZZ_SECONDS (default 5) is the budget, spent as consecutive
Hypothesis runs with seeds 0, 1, 2, ... so a failure names the seed that reproduces it. CI runs it
with C2S_FUZZ_SECONDS=600.
"""
import json
import os
import string
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from compose2sif.convert import ConvertOptions, convert
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions
from compose2sif.load.schema import SCHEMA_PATH

with open(SCHEMA_PATH, encoding="utf-8") as _fh:
    SCHEMA = json.load(_fh)

WORD = st.text(alphabet=string.ascii_lowercase[:5] + "019._-/", min_size=1, max_size=8)
HOSTILE = st.text(alphabet=string.ascii_letters[:4] + "019 ._-/\\$${}()`'\":=,#*&!%\n\x00é", max_size=10)
STRINGS = st.one_of(WORD, HOSTILE, st.sampled_from(["/", "./x", "../x", "127.0.0.1:80:80", "8080", "1s", "--all",
                                                    "CMD", "CMD-SHELL", "{port}", "}", "{nope}", "a" * 300]))
ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), STRINGS),
                   lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(WORD, inner, max_size=3)),
                   max_leaves=6)


def _resolve(node):
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def shaped(node, depth=0):
    """A value of the shape a schema node describes (loosely: patterns and bounds are not kept,
    so that the loader's own checks are reached too), or of another shape one time in eight."""
    node = _resolve(node)
    choices = node.get("oneOf") or node.get("anyOf")
    if choices:
        return st.one_of([shaped(c, depth) for c in choices])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    types = node.get("type", ["string", "object", "array"])
    types = [types] if isinstance(types, str) else types
    options = []
    for kind in types:
        if kind == "string":
            options.append(STRINGS)
        elif kind in ("integer", "number"):
            options.append(st.integers(-2, 70000))
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "null":
            options.append(st.none())
        elif kind == "array":
            options.append(st.lists(shaped(node.get("items", {"type": "string"}), depth + 1), max_size=3)
                           if depth < 4 else st.just([]))
        elif kind == "object":
            properties = node.get("properties") or {}
            if properties and depth < 4:
                options.append(st.fixed_dictionaries({}, optional={k: st.deferred(lambda v=v: shaped(v, depth + 1))
                                                                   for k, v in properties.items()}))
            else:
                value = (node.get("patternProperties") or {}).values()
                inner = shaped(next(iter(value)), depth + 1) if value and depth < 4 else STRINGS
                options.append(st.dictionaries(WORD, inner, max_size=3))
    shape = st.one_of(options) if options else ANY
    return st.one_of(shape, shape, shape, shape, shape, shape, shape, ANY)


SERVICE_KEYS = SCHEMA["definitions"]["service"]["properties"]
# The planner's own extension (docs/support.md): the shapes it reads, and strings where they go.
PORT_HINT = st.one_of(st.fixed_dictionaries({"env": WORD}, optional={"template": STRINGS}),
                      st.fixed_dictionaries({"flag": st.sampled_from(["--port", "-p"])}),
                      st.just({"fixed": True}), ANY)
X_COMPOSE2SIF = st.one_of(ANY, st.fixed_dictionaries({}, optional={
    "image": st.one_of(st.dictionaries(st.sampled_from(["docker", "sif", "oras", "build"]), STRINGS,
                                       max_size=1), ANY),
    "writable": st.one_of(st.lists(STRINGS, max_size=3), ANY),
    "writable_tmpfs": ANY,
    "ports": st.one_of(st.dictionaries(st.sampled_from(["80", "8080", "0", "x"]), PORT_HINT, max_size=2), ANY),
    "bind_address": PORT_HINT}))
SERVICE_NAMES = st.one_of(st.sampled_from(["app", "db", "web.1", "x_y-z", "-lead", "a" * 300]), WORD)


@st.composite
def schema_service(draw):
    service = {"image": draw(st.sampled_from(["busybox", "nginx:1", "redis:7", "postgres:16", "mysql:8"]))}
    for key in draw(st.lists(st.sampled_from(sorted(SERVICE_KEYS)), max_size=4, unique=True)):
        service[key] = draw(shaped(SERVICE_KEYS[key]))
    if draw(st.booleans()):
        service["x-compose2sif"] = draw(X_COMPOSE2SIF)
    return service


@st.composite
def schema_projects(draw):
    names = draw(st.lists(SERVICE_NAMES, min_size=1, max_size=3, unique=True))
    document = {"services": {name: draw(schema_service()) for name in names}}
    for kind in draw(st.lists(st.sampled_from(["volumes", "networks", "secrets", "configs"]), max_size=2)):
        document[kind] = draw(shaped(SCHEMA["properties"][kind]))
    return yaml.safe_dump(document, allow_unicode=True)


def convert_or_refuse(work, text):
    """Convert the project in `work`; returns the ComposeError's text, or None when it converted."""
    (work / "compose.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    (work / "nginx.conf").write_text("server { listen 80; }\n")
    options = ProjectOptions(cwd=str(work), environ={"PATH": "/usr/bin:/bin", "HOME": str(work)})
    try:
        convert(options, ConvertOptions(output=str(work / "out"), offline=True), lambda line: None)
    except ComposeError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        return message
    return None


def test_convert_of_schema_shaped_projects_never_crashes(tmp_path_factory):
    budget = float(os.environ.get("C2S_FUZZ_SECONDS", "5"))
    seen = {"examples": 0, "refused": 0}

    def one_run(run_seed):
        @seed(run_seed)
        @settings(max_examples=25, deadline=None, database=None, derandomize=False,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large, HealthCheck.filter_too_much])
        @given(text=schema_projects())
        def check(text):
            seen["examples"] += 1
            if convert_or_refuse(tmp_path_factory.mktemp("fuzz"), text) is not None:
                seen["refused"] += 1
        check()

    start, run_seed = time.monotonic(), 0
    while time.monotonic() - start < budget:
        one_run(run_seed)
        run_seed += 1
    print(f"fuzz: {seen['examples']} projects in {time.monotonic() - start:.1f}s, {run_seed} seeds, "
          f"{seen['refused']} refused with a ComposeError")


@pytest.mark.parametrize("x_compose2sif, wording", [
    ("{writable: [1]}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("{writable: [[]]}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("{writable: /str}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("x", "x-compose2sif: must be a mapping"),
    ("{image: x}", "x-compose2sif.image: must be a mapping with one of"),
    ("{ports: {'80': {env: PORT, template: '}'}}}", "x-compose2sif.ports.80.template: template '}'"),
    ("{ports: {'80': {env: PORT, template: '{nope}'}}}", "x-compose2sif.ports.80.template: template '{nope}'"),
    ("{ports: {'80': {env: PORT, template: '{port[0]}'}}}", "x-compose2sif.ports.80.template"),
])
def test_malformed_hints_are_one_located_line(tmp_path, x_compose2sif, wording):
    text = f"services:\n  app:\n    image: busybox\n    ports: ['80']\n    x-compose2sif: {x_compose2sif}\n"
    message = convert_or_refuse(tmp_path, text)
    assert message is not None and wording in message, message
    assert message.startswith(f"{tmp_path / 'compose.yaml'}:2: services.app."), message


def test_an_unreadable_or_endless_nginx_config_is_one_located_line(tmp_path):
    (tmp_path / "conf.d").mkdir()
    os.mkfifo(tmp_path / "conf.d" / "default.conf")  # reading it would block forever
    text = "services:\n  web:\n    image: nginx:1\n    volumes: ['./conf.d:/etc/nginx/conf.d']\n"
    message = convert_or_refuse(tmp_path, text)
    assert message is not None and "default.conf: mounted into nginx's configuration, but not a regular file" \
        in message and "services.web.volumes" in message, message

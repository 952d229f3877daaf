"""YAML aliases as Docker Compose 2.40.3 takes them (compose-go v2.9.1, loader/reset.go): no limit on how
far they expand (a billion-laughs file loads, slowly), its cycle check and its false alarms, and yaml.v3's
own rules only where ResetProcessor leaves aliases in place. Beyond compose2sif's bound
(yaml_source.MAX_EXPANDED_NODES, docs/loader.md) a file is refused at once, in one line."""
import time
from pathlib import Path

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.load.yaml_source import MAX_EXPANDED_NODES
from oracle import base_env, differences, oracle_mark, run_oracle, run_ours

# GOGC=off (oracle.py's default) lets the oracle hold every byte it ever allocated: gigabytes here
ENV = base_env({"GOGC": "100"})


def _alias_bomb(levels: int) -> str:
    """x-a0 is one scalar; x-aN lists *a(N-1) ten times: x-aN expands to 10**N scalars."""
    lines = ['x-a0: &a0 "lol"']
    lines += [f"x-a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nservices:\n  a:\n    image: a\n"


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "compose.yaml").write_text(text)
    return tmp_path


def _one_error_line(err: str, cwd: Path) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith("compose2sif: error: ") and str(cwd / "compose.yaml") in lines[0], err
    return lines[0]


@oracle_mark()
@pytest.mark.parametrize("levels", [4, 5])  # 12,3xx and 123,4xx nodes expanded; the oracle takes ~0.5 s and ~5 s
def test_an_alias_bomb_compose_loads_loads_equal_to_compose(tmp_path, levels):
    cwd = _write(tmp_path, _alias_bomb(levels))
    rc, theirs, err = run_oracle([], cwd, ENV)
    assert rc == 0, err
    rc, ours, err = run_ours([], cwd, ENV)
    assert rc == 0, err
    assert len(ours[f"x-a{levels}"]) == 10
    problems = differences(ours, theirs)
    assert not problems, "\n".join(problems)


def test_six_levels_load(tmp_path):
    # 1,234,5xx nodes: the oracle loads it too, in 44-94 s and 380 MB (too slow to ask here); we need ~2 s
    cwd = _write(tmp_path, _alias_bomb(6))
    project = load_project(ProjectOptions(cwd=str(cwd), environ={"PATH": "/usr/bin:/bin"}))
    assert project.config["x-a6"][9][9][9][9][9][9] == "lol"


@pytest.mark.parametrize("levels", [7, 30])
def test_a_file_beyond_the_bound_is_refused_at_once_in_one_line(tmp_path, levels):
    # 7 levels: 12.3 million nodes; Docker Compose had not finished after 308 s and 3.2 GB (and ignores
    # SIGTERM meanwhile). 30 levels: 10**30 nodes.
    cwd = _write(tmp_path, _alias_bomb(levels))
    started = time.monotonic()
    with pytest.raises(ComposeError, match=f"compose2sif reads at most {MAX_EXPANDED_NODES:,}"):
        load_project(ProjectOptions(cwd=str(cwd), environ={"PATH": "/usr/bin:/bin"}))
    assert time.monotonic() - started < 1
    started = time.monotonic()
    rc, _, err = run_ours([], cwd, ENV)
    assert time.monotonic() - started < 1
    assert rc != 0
    line = _one_error_line(err, cwd)
    assert "aliases expand this document to" in line and f"{MAX_EXPANDED_NODES:,}" in line


# what Docker Compose prints after "failed to parse FILE: ", for files it refuses at once
REFUSED = {
    "list-contains-itself": ("x-a: &a [1, *a]\n", "cycle detected: node at path x-a.1.1 references node at path x-a.1"),
    "mapping-contains-itself": ("x-a: &a {b: *a}\n",
                                "cycle detected: node at path x-a.b.b references node at path x-a.b"),
    "service-merged-into-its-labels": ("services:\n  a: &a\n    image: a\n    labels:\n      <<: *a\n",
                                       "cycle detected: node at path services.a.labels.labels references node at "
                                       "path services.a.labels"),
    # no cycle: compose-go's check takes one anchor merged at a path and again below it for one
    "merged-twice-one-below-the-other": ("x-b: &b {image: a}\nservices:\n  a:\n    <<: *b\n    build:\n      <<: *b\n"
                                         "      context: .\n",
                                         "cycle detected: node at path services.a.build references node at path "
                                         "services.a"),
    # aliases ResetProcessor does not replace meet yaml.v3's own rules
    "override-contains-itself": ("x-o: !override &a [*a]\n", "yaml: anchor 'a' value contains itself"),
    "key-contains-itself": ("x-k:\n  ? &a [*a]\n  : v\n", "yaml: anchor 'a' value contains itself"),
    "bomb-inside-override": ("x-o: !override\n  a0: &a0 lol\n"
                             + "".join(f"  a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 5)),
                             "yaml: document contains excessive aliasing"),
}


@oracle_mark()
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_as_compose_refuses_it(tmp_path, name):
    text, message = REFUSED[name]
    cwd = _write(tmp_path, text + ("" if "services:" in text else "services:\n  a:\n    image: a\n"))
    rc, _, theirs = run_oracle([], cwd, ENV)
    assert rc != 0 and theirs.strip().endswith(f"failed to parse {cwd / 'compose.yaml'}: {message}"), theirs
    rc, _, err = run_ours([], cwd, ENV)
    assert rc != 0
    assert _one_error_line(err, cwd).endswith(f": {message}")


@pytest.mark.parametrize("text", [
    "x-a: &a\n  <<: *a\n",            # the same path each time: compose-go loops on it (killed after 60 s)
    "<<: &a\n  x-b: *a\n",            # a path with '<<' left in it: compose-go runs out of memory in 17 s
    # *a2 replaced by its node, which holds *a1, replaced by its !override node, which holds that node
    # again without an alias: yaml.v3 decodes round it until its stack overflows
    "x-o: !override &a1 [&a2 {k: *a1}]\nx-e: [*a2]\n",
], ids=["merged-into-itself", "under-a-top-level-merge", "override-round-a-replaced-alias"])
def test_a_cycle_compose_does_not_detect_is_refused_at_once(tmp_path, text):
    cwd = _write(tmp_path, text + "services:\n  a:\n    image: a\n")
    started = time.monotonic()
    rc, _, err = run_ours([], cwd, ENV)
    assert time.monotonic() - started < 1
    assert rc != 0
    line = _one_error_line(err, cwd)
    assert "contains itself through aliases; Docker Compose " in line and "runs out of" in line


@oracle_mark()
@pytest.mark.parametrize("text", [
    "x-b: &b {FOO: a}\nservices:\n  a:\n    image: a\n    environment: *b\n    labels: *b\n",
    "x-r: !reset &a [*a]\nservices:\n  a:\n    image: a\n",   # never walked nor decoded
    "x-b: &b {FOO: a}\nservices:\n  a: !override\n    image: a\n    environment: *b\n    labels: *b\n",
    "x-c: &c {image: a, environment: {A: b}}\nservices:\n" + "".join(f"  s{i}:\n    <<: *c\n" for i in range(40)),
    # compose-go drops a !reset value, so a merge of one merges nothing (and never reads it)
    "x-r: !reset &r {a: [*r]}\nx-f: {<<: *r, m: v}\nx-g: {<<: [*r, {b: 2}], m: v}\nx-h: [*r, 1]\n"
    "services:\n  a:\n    image: a\n",
    "x-b: {<<: {}, n: 1}\nx-c: {<<: [], n: 1}\nservices:\n  a:\n    image: a\n",
], ids=["one-anchor-at-sibling-paths", "reset-contains-itself", "aliases-inside-override", "merged-into-40-services",
        "merging-a-reset", "merging-nothing"])
def test_aliases_compose_takes_load_equal_to_compose(tmp_path, text):
    cwd = _write(tmp_path, text)
    rc, theirs, err = run_oracle([], cwd, ENV)
    assert rc == 0, err
    rc, ours, err = run_ours([], cwd, ENV)
    assert rc == 0, err
    problems = differences(ours, theirs)
    assert not problems, "\n".join(problems)


def test_a_shared_anchor_within_go_yaml_s_ratio_loads(tmp_path):
    # 30 services merging one 50-label anchor: about 3,000 of 3,200 decoded nodes come through aliases
    labels = "".join(f"\n    l{i}: v" for i in range(50))
    services = "".join(f"\n  s{i}:\n    <<: *common\n    image: a" for i in range(30))
    (tmp_path / "compose.yaml").write_text(f"x-common: &common\n  labels:{labels}\nservices:{services}\n")
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"PATH": "/usr/bin:/bin"}))
    assert len(project.config["services"]["s29"]["labels"]) == 50

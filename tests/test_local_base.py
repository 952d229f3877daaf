"""A Dockerfile FROM an image that another service of the project builds (sentry-self-hosted's
cron image starts FROM the image `web` builds): planned as a `Bootstrap: localimage` stage from that
service's SIF, built after it by run.sh, and built again when it changes.

The runtime in the run.sh tests is a BUILDING STAND-IN for apptainer (written below): `build`
records the order, refuses a definition whose localimage From (relative, as Apptainer resolves it)
does not exist from its current directory, fails a definition that contains FAIL, and writes a
small file where the SIF goes. The test bed builds the same with the real Apptainer
(tests/e2e/test_builds.py)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.model import services as typed_services
from compose2sif.plan.images import plan_images
from compose2sif.plan.mirrors import Mirrors
from helpers import compose2sif_forked

REPO = Path(__file__).resolve().parent.parent

# sentry-self-hosted's shape: an x- anchor gives many services one built image; the cron image is
# built FROM it through a build argument
SENTRY_LIKE = """
x-sentry: &sentry
  image: sentry-self-hosted-local
  pull_policy: never
  build:
    context: ./sentry
    args: [SENTRY_IMAGE]
services:
  sentry-cleanup:
    <<: *sentry
    image: sentry-cleanup-self-hosted-local
    build:
      context: ./cron
      args:
        BASE_IMAGE: sentry-self-hosted-local
  web:
    <<: *sentry
  worker:
    <<: *sentry
    command: run worker
"""


def write(root: Path, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


def images(root: Path, environ=None):
    project = load_project(ProjectOptions(cwd=str(root), environ={"HOME": "/home/u", **(environ or {})}))
    return plan_images(list(typed_services(project).values()), project.working_dir, Mirrors(), {})


def headers(definition: str):
    return [line for line in definition.splitlines() if line.startswith(("Bootstrap:", "From:"))]


def test_from_a_sibling_image_starts_from_its_sif_and_it_comes_first(tmp_path):
    write(tmp_path, {"compose.yaml": SENTRY_LIKE,
                     "sentry/Dockerfile": "ARG SENTRY_IMAGE\nFROM ${SENTRY_IMAGE}\n",  # stand-ins for upstream's
                     "cron/Dockerfile": "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN apt-get install -y cron\n"})
    sources = images(tmp_path, {"SENTRY_IMAGE": "ghcr.io/getsentry/sentry:nightly"})
    assert list(sources) == ["sentry-self-hosted-local", "sentry-cleanup-self-hosted-local"]
    assert sources["sentry-self-hosted-local"].services == ["web", "worker"]
    assert headers(sources["sentry-self-hosted-local"].definition) == [
        "Bootstrap: docker", "From: ghcr.io/getsentry/sentry:nightly"]
    assert headers(sources["sentry-cleanup-self-hosted-local"].definition) == [
        "Bootstrap: localimage", "From: sif/sentry-self-hosted-local.sif"]


def test_tagged_names_copy_from_and_a_pulled_sibling(tmp_path):
    write(tmp_path, {"compose.yaml": """
        services:
          a: {image: local-a, build: ./a, pull_policy: build}
          b: {build: ./b}
          c: {image: "redis:7", build: ./c}
        """,
        "a/Dockerfile": "FROM debian:12\n",
        "b/Dockerfile": "FROM docker.io/library/local-a:latest AS one\n"
                        "FROM redis:7\nCOPY --from=local-a /etc/os-release /a-release\n",
        "c/Dockerfile": "FROM debian:12\n"})
    # c is pulled (its registry answered), so FROM redis:7 is a pull as before
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    sources = plan_images(list(typed_services(project).values()), project.working_dir, Mirrors(), {},
                          {"redis:7": object()})
    b = sources["build-b"].definition
    assert headers(b) == ["Bootstrap: localimage", "From: sif/local-a.sif", "Bootstrap: docker", "From: redis:7"]
    assert "%files from c2s_image_" in b


@pytest.mark.parametrize("a_from,b_from,chain", [
    ("img-b", "img-a", "services 'a' FROM 'b' FROM 'a'"),
    ("debian:12\nCOPY --from=img-b /x /x", "img-a", "services 'a' FROM 'b' FROM 'a'"),
])
def test_a_cycle_is_refused_in_one_line_naming_the_services(tmp_path, a_from, b_from, chain):
    write(tmp_path, {"compose.yaml": """
        services:
          a: {image: img-a, build: ./a}
          b: {image: img-b, build: ./b}
        """, "a/Dockerfile": f"FROM {a_from}\n", "b/Dockerfile": f"FROM {b_from}\n"})
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(tmp_path / "out")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("WARN")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "a cycle of images built from each other: " + chain + "; refused" in errors[0], errors[0]
    with pytest.raises(ComposeError):
        images(tmp_path)


def test_a_build_from_its_own_image_name_starts_from_the_registry_image(tmp_path):
    """temporal's grafana: `image: grafana/grafana:7.5.16` built FROM that same name. Docker Compose
    builds it from the registry's image (then tags the result with that name): no cycle."""
    write(tmp_path, {"compose.yaml": """
        services:
          a: {image: "grafana/grafana:7.5.16", build: ./a}
        """, "a/Dockerfile": "FROM grafana/grafana:7.5.16\nCOPY x /x\n", "a/x": ""})
    definition = next(iter(images(tmp_path).values())).definition
    assert headers(definition)[:2] == ["Bootstrap: docker", "From: grafana/grafana:7.5.16"]


STANDIN = """#!/bin/bash
# BUILDING STAND-IN for apptainer (tests only)
case "$1" in
    --version) echo "apptainer version 1.4.5" ;;
    build) shift; [ "$1" = --force ] && shift; [ "$1" = --fakeroot ] && shift
        echo "${2##*/}" >>"$C2S_BUILD_ORDER"
        for base in $(sed -n 's|^From: \\(sif/.*\\)|\\1|p' "$2"); do
            [ -f "$base" ] || { echo "FATAL: $base: no such file (from $PWD)"; exit 1; }
        done
        ! grep -q FAIL "$2" || { echo "FATAL: told to fail"; exit 1; }
        cat "$2" >"$1" ;;
esac
"""


@pytest.fixture
def stack(tmp_path):
    write(tmp_path / "proj", {"compose.yaml": """
        services:
          a: {image: local-a, build: ./a, command: sleep 1}
          b: {image: local-b, build: ./b}
          c: {build: ./c}
          d: {build: ./d}
        """,
        "a/Dockerfile": "FROM debian:12\nRUN echo a\n", "b/Dockerfile": "FROM local-a\nRUN echo b\n",
        "c/Dockerfile": "FROM local-b\nRUN echo c\n", "d/Dockerfile": "FROM debian:12\nRUN echo d\n"})
    standin = tmp_path / "bin" / "apptainer"
    standin.parent.mkdir()
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    env = {"PATH": f"{standin.parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
           "USER": "c2s-test-nobody", "C2S_BUILD_ORDER": str(tmp_path / "order"), "LANG": "C.UTF-8",
           "C2S_STORAGE": str(tmp_path / "store"), "C2S_BUILD_JOBS": "4"}
    convert(tmp_path, env)
    return tmp_path, env


def convert(tmp_path, env):
    proc = compose2sif_forked(["convert", "--offline", "-o", str(tmp_path / "out")], tmp_path / "proj", env)
    assert proc.returncode == 0, proc.stderr


def build(tmp_path, env, cwd="/"):
    """run.sh build from another directory than the output directory, as a batch job may."""
    (tmp_path / "order").unlink(missing_ok=True)
    proc = subprocess.run([str(tmp_path / "out" / "run.sh"), "build"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    order = (tmp_path / "order").read_text().split() if (tmp_path / "order").exists() else []
    return proc, [name[:-len(".def")] for name in order]


def states(proc):
    return sorted(line.split("] image ", 1)[1] for line in proc.stderr.splitlines() if "] image " in line)


def test_run_sh_builds_bases_first_and_again_when_a_base_changed(stack):
    tmp_path, env = stack
    proc, order = build(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert order.index("local-a") < order.index("local-b") < order.index("build-c"), order
    assert sorted(order) == ["build-c", "build-d", "local-a", "local-b"]
    proc, order = build(tmp_path, env)
    assert proc.returncode == 0 and order == [], proc.stderr
    assert states(proc) == ["build-c: up to date", "build-d: up to date", "local-a: up to date", "local-b: up to date"]
    # a's Dockerfile changes: a, and b and c that start from it, are built again; d is not
    (tmp_path / "proj" / "a" / "Dockerfile").write_text("FROM debian:12\nRUN echo a2\n")
    convert(tmp_path, env)
    proc, order = build(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert order == ["local-a", "local-b", "build-c"], order
    # b's definition is unchanged, yet its SIF is a new one (its digest covers a's)
    assert "local-b: built" in states(proc)


def test_a_failed_base_fails_what_starts_from_it_naming_it(stack):
    tmp_path, env = stack
    (tmp_path / "proj" / "a" / "Dockerfile").write_text("FROM debian:12\nRUN echo FAIL\n")
    convert(tmp_path, env)
    proc, order = build(tmp_path, env)
    assert proc.returncode == 1
    assert sorted(order) == ["build-d", "local-a", "local-a"], order  # tried again alone, then given up
    assert "local-b: not built: it starts from image local-a, which failed" in states(proc)
    assert "build-c: not built: it starts from image local-b, which failed" in states(proc)
    assert "build-d: built" in states(proc)
    log = tmp_path / "out" / "state" / "logs" / "build-local-a.log"
    assert f"run.sh: building image local-a failed; last lines of {log}:\nFATAL: told to fail" in proc.stderr

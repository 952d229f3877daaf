"""The network plan on the 39 real-world projects (../shared/realworld/, each with a PROVENANCE.md), read
the way their READMEs run them. Each project either plans with no two endpoints colliding, nothing
below 1024 and every reference to another service hitting one of its planned endpoints, or is
refused with one line naming the clash and the x-compose2sif hint that fixes it.

Their Dockerfiles are not stored: a build whose Dockerfile is missing gets a stand-in
(`FROM debian:12 [AS target]`, written into a copy of the project), which says nothing about ports."""
import re
import shutil
from pathlib import Path

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan, image_definitions
from compose2sif.plan.network import References, overlaps
from helpers import check_plan, plan_texts

REALWORLD = Path(__file__).resolve().parent.parent.parent / "shared" / "realworld"

# project -> (directory inside it, compose files, extra environment), as upstream runs it
PROJECTS = {
    "airflow": (".", ["docker-compose.yaml"], {"COMPOSE_PROFILES": "flower"}),
    "anythingllm": ("docker", ["docker-compose.yml"], {}),
    "bisheng": ("docker", ["docker-compose.yml"], {}),
    "cognita": (".", ["docker-compose.yaml"], {}),
    "coze-studio": ("docker", ["docker-compose.yml"], {}),
    "directus": (".", ["docker-compose.yml"], {}),
    "fastgpt": (".", ["docker-compose.yml"], {}),
    "flowise": (".", ["docker-compose-queue-prebuilt.yml"], {}),
    "immich": (".", ["docker-compose.yml"], {}),
    "khoj": (".", ["docker-compose.yml"], {}),
    "langfuse": (".", ["docker-compose.yml"], {}),
    "librechat": (".", ["docker-compose.yml"], {}),
    "lobechat": (".", ["docker-compose.yml"], {}),
    "mattermost": (".", ["docker-compose.yml", "docker-compose.nginx.yml"], {}),
    "mem0": ("server", ["docker-compose.yaml"], {}),
    "milvus-cluster": (".", ["docker-compose.yml"], {}),
    "n8n-ai-starter": (".", ["docker-compose.yml"], {"COMPOSE_PROFILES": "gpu-nvidia"}),
    "nextcloud-fpm": (".", ["compose.yaml"], {}),
    "opik": ("deployment/docker-compose", ["docker-compose.yaml", "docker-compose.override.yaml"], {}),
    "onyx": ("deployment/docker_compose", ["docker-compose.yml"], {}),
    "open-webui": (".", ["docker-compose.yaml", "docker-compose.gpu.yaml", "docker-compose.api.yaml"], {}),
    "paperless-ngx": ("docker/compose", ["docker-compose.postgres-tika.yml"], {}),
    "penpot": (".", ["docker-compose.yaml"], {}),
    "plane": (".", ["docker-compose.yml"], {}),  # with --env-file plane.env (ENV_FILES), as its install.sh runs it
    "plausible": (".", ["compose.yml", "compose.override.yml"], {}),
    "prefect": (".", ["compose.yml"], {}),
    "qanything": (".", ["docker-compose-linux.yaml"], {}),
    "r2r": ("docker", ["compose.full.yaml"], {"COMPOSE_PROFILES": "postgres"}),
    "ragflow": (".", ["docker-compose.yml"], {}),
    "sentry-self-hosted": (".", ["docker-compose.yml"], {}),
    "supabase": (".", ["docker-compose.yml"], {}),
    "superagi": (".", ["docker-compose.yaml"], {}),
    "surfsense": ("docker", ["docker-compose.yml"], {}),
    "taskingai": ("docker", ["docker-compose.yml"], {}),
    "temporal": (".", ["docker-compose-multirole.yaml"], {}),
    "weblate": (".", ["docker-compose-split.yml", "docker-compose.override.yml"], {}),  # the split form: 9 services
    "windmill": (".", ["docker-compose.yml"], {}),
    "zep-ce": ("legacy", ["docker-compose.ce.yaml"], {}),
    "zulip": (".", ["compose.yaml", "compose.override.yaml"], {}),
}

# project -> the --env-file its documentation runs it with (relative to its directory)
ENV_FILES = {"plane": ["plane.env"]}


def _load(name: str, tmp_path: Path, dockerfiles=None, added=None):
    """The project, in a copy; ``dockerfiles``: stand-ins to write (path in the project -> text);
    ``added``: files to write beside its compose files (name -> text), each ``*.yaml`` of them a
    compose file loaded after the project's own (a fix, as a user adds one)."""
    if not REALWORLD.is_dir():
        pytest.fail(f"{REALWORLD} is missing: ../shared must be beside the repository")
    copy = tmp_path / name
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(REALWORLD / name, copy, symlinks=True)
    for path, text in (dockerfiles or {}).items():
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        (copy / path).write_text(text)
    subdir, files, env = PROJECTS[name]
    cwd = copy / subdir
    for path, text in (added or {}).items():
        (cwd / path).write_text(text)
    files = files + sorted(p for p in (added or {}) if p.endswith(".yaml"))
    options = ProjectOptions(cwd=str(cwd), files=[str(cwd / f) for f in files],
                             env_files=[str(cwd / f) for f in ENV_FILES.get(name, [])],
                             environ={"HOME": "/home/user", "USER": "user", **env})
    project = load_project(options)
    for service in (project.model.get("services") or {}).values():
        build = service.get("build")
        if isinstance(build, dict) and not build.get("dockerfile_inline"):
            dockerfile = Path(build.get("context", cwd)) / (build.get("dockerfile") or "Dockerfile")
            if not dockerfile.exists() and str(dockerfile).startswith(str(tmp_path)):
                dockerfile.parent.mkdir(parents=True, exist_ok=True)
                stage = f" AS {build['target']}" if build.get("target") else ""
                dockerfile.write_text(f"FROM debian:12{stage}\n")  # stand-in: the corpus keeps no Dockerfiles
    return load_project(options)


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_realworld_project_plans_soundly_or_is_refused_with_the_fix(name, tmp_path):
    project = _load(name, tmp_path)
    try:
        plan = build_plan(project, PlanOptions(port_base=30000, address_block="127.45.3",
                                               uid=1000))
    except ComposeError as exc:
        message = str(exc)
        assert "\n" not in message
        assert "; fix: " in message and ("both listen on port" in message or "cannot move it" in message)
        return  # test_refusal_fixes applies the fix
    check_plan(plan)


def test_every_realworld_project_is_in_the_table():
    assert sorted(p.name for p in REALWORLD.iterdir() if p.is_dir()) == sorted(PROJECTS)


def test_sentry_cron_image_is_built_from_the_image_web_builds(tmp_path):
    """sentry-cleanup's build passes BASE_IMAGE=sentry-self-hosted-local, the image `web` (and the
    other x-sentry-defaults services) builds: it starts from that SIF, not from a pull of
    docker.io/library/sentry-self-hosted-local. The Dockerfiles are stand-ins with upstream's FROMs."""
    project = _load("sentry-self-hosted", tmp_path, {
        "sentry/Dockerfile": "ARG SENTRY_IMAGE\nFROM ${SENTRY_IMAGE}\n",
        "cron/Dockerfile": "ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN apt-get update && apt-get install -y cron\n"})
    images = image_definitions(project)
    keys = list(images)
    assert keys.index("sentry-self-hosted-local") < keys.index("sentry-cleanup-self-hosted-local")
    assert "web" in images["sentry-self-hosted-local"].services
    assert images["sentry-cleanup-self-hosted-local"].services == ["sentry-cleanup"]
    head = [line for line in images["sentry-cleanup-self-hosted-local"].definition.splitlines()
            if line.startswith(("Bootstrap:", "From:"))]
    assert head == ["Bootstrap: localimage", "From: sif/sentry-self-hosted-local.sif"]
    assert "From: ghcr.io/getsentry/sentry:nightly" in images["sentry-self-hosted-local"].definition


# ---- with a loopback per service (issue 23) -----------------------------------------------------

# The projects the plan-time knobs alone cannot run as written (test_refusal_fixes' table: each is
# refused until the user tells a program another port), and why a loopback of each service's own
# (bin/c2s-loopback) runs them as they are: the ports are fixed where no knob reaches.
WITH_LOOPBACK = {
    "khoj": "search and sandbox on 8080, fixed in their images: each on its own address",
    "onyx": "two model servers of one image on 9000: each copy on its own address",
    "r2r": "hatchet-dashboard on 80, in a config built into its image: onto the project's block",
    "ragflow": "the web front's 80 and 443, in an nginx config built into the ragflow image: onto the block",
    "surfsense": "searxng and opensandbox-server on 8080, fixed in their images: each on its own address",
    "taskingai": "frontend on 80 (onto the block); four backends of one image on 8000: each on its own address",
    "windmill": "caddy on 25 and 80, its Caddyfile's: onto the block",
    "zulip": "25, 80 and 443, fixed inside the zulip image: onto the block",
}


# fastgpt: five Node servers on 3000 (Node's default), and fastgpt publishes 3000 on its own number.
# As written, each listens on its own address and a forwarder serves the published 3000 on the node's
# addresses; the plan-time knobs' fallback serves it on the node's wildcard, where no other service
# can have 3000 on an address of its own, so there the project is refused (with its fix).
STILL_REFUSED = {"fastgpt"}


def test_the_projects_the_knobs_cannot_fix_are_those_the_loopback_runs():
    from test_refusal_fixes import TABLE
    refused = {name for name, kinds in TABLE.items() if kinds != "clean"}
    assert refused - STILL_REFUSED == set(WITH_LOOPBACK) and STILL_REFUSED <= refused


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_with_a_loopback_per_service_every_project_runs_as_written(name, tmp_path):
    """convert with bin/c2s-loopback (the default): no refusal, nothing moved, nothing told. Every
    service listens on its own address on the ports its files give it, so no two collide; every
    published port has a forwarder, and no two forwarders share an address and port; every
    reference to another service names a port that service listens on."""
    plan = build_plan(_load(name, tmp_path), PlanOptions(port_base=30000, address_block="127.45.3", uid=1000,
                                                         loopback=True))
    own = {n: address for address, names in plan.hosts for n in names}
    forwards = []
    for s in plan.services:
        assert not s.needs_loopback, s.name
        for p in s.ports:
            assert (p.address, p.host) == (own[s.name], p.container), f"{s.name}: {p.address}:{p.host}"
            if p.published:
                assert p.forward, f"{s.name}: published {p.container} without a forwarder"
                at, number = p.forward.rsplit(":", 1)
                if int(number) == 0:  # no host side: a free port of the node, chosen by `up`
                    continue
                assert int(number) >= 1024, f"{s.name}: a forwarder on privileged {p.forward}"
                forwards.append(((at, int(number)), s.name))
    for i, (a, sa) in enumerate(forwards):
        for b, sb in forwards[i + 1:]:
            assert not overlaps(a, b), f"{sa} and {sb} both publish {a}"
    finder = References({s.name: s.names for s in plan.services})
    listening = {(s.name, p.container) for s in plan.services for p in s.ports}
    for client, text in plan_texts(plan):
        for server, port in finder.references(text):
            assert (server, port) in listening, f"{client} names {server}:{port}, where {server} does not listen"


@pytest.mark.parametrize("name", sorted(STILL_REFUSED))
def test_a_port_published_on_its_own_number_that_others_use_too_is_refused_by_the_fallback(name, tmp_path):
    plan = build_plan(_load(name, tmp_path), PlanOptions(port_base=30000, address_block="127.45.3",
                                                         uid=1000, loopback=True))
    assert plan.fallback is None and re.search(r"both listen on port 3000 .*; fix: ", plan.fallback_refusal)
    assert any(w.startswith("where a node cannot give each service a loopback of its own, `up` refuses this "
                            "project: ") for w in plan.warnings)


@pytest.mark.parametrize("name", sorted(WITH_LOOPBACK))
def test_a_project_the_knobs_cannot_fix_is_refused_by_the_fallback_service_by_service(name, tmp_path):
    """The fallback of a project the knobs cannot fix: each service whose port cannot move carries the
    one line `up` prints where it would run untraced (fallback/plan.json's needs_loopback, with the
    fix for such nodes), and convert names them in one line."""
    project = _load(name, tmp_path)
    options = dict(port_base=30000, address_block="127.45.3", uid=1000)
    with pytest.raises(ComposeError):
        build_plan(project, PlanOptions(**options))
    plan = build_plan(project, PlanOptions(**options, loopback=True))
    refused = {s.name: s.needs_loopback for s in plan.fallback.services if s.needs_loopback}
    assert refused, "nothing would be refused without the tracer"
    for line in refused.values():
        assert "\n" not in line and "; fix: " in line and ("both listen on port" in line or "cannot move it" in line)
        assert any(w.startswith(line) and "with the plan-time knobs only, `up` refuses it" in w
                   for w in plan.fallback.warnings)
    summary = next(w for w in plan.warnings if w.startswith("where a node cannot give each service a loopback"))
    assert "refused there: " + ", ".join(refused) in summary

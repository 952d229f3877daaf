"""Image sources: hostile values refused with one line, shared builds, build + image and pull_policy,
ARGs that leave FROM empty, Dockerfiles that are not UTF-8."""
import json
import os
import textwrap

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.model import services as typed_services
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.images import plan_images
from compose2sif.plan.mirrors import Mirrors
from compose2sif.registry import ImageConfig
from helpers import compose2sif_forked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DOCKERFILE = "ARG BASE=python:3.12-slim\nFROM ${BASE}\nCOPY app.py /app/\nCMD [\"python\", \"/app/app.py\"]\n"


def project_at(tmp_path, compose, environ=None, dockerfile=DOCKERFILE):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    (tmp_path / "app").mkdir(exist_ok=True)
    (tmp_path / "app" / "app.py").write_text("print('hi')\n")
    if isinstance(dockerfile, bytes):
        (tmp_path / "app" / "Dockerfile").write_bytes(dockerfile)
    else:
        (tmp_path / "app" / "Dockerfile").write_text(dockerfile)
    return load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u", **(environ or {})}))


def images_of(project, image_configs=None):
    return plan_images(list(typed_services(project).values()), project.working_dir, Mirrors(), {}, image_configs)


def convert(tmp_path, *args, env=None):
    """compose2sif convert --offline, this checkout's code, as a user runs it (forked: helpers.compose2sif_forked)."""
    return compose2sif_forked(["convert", "--offline", "-o", str(tmp_path / "out"), *args], tmp_path,
                              {"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONPATH": REPO, **(env or {})})


@pytest.mark.parametrize("compose,path", [
    ('services: {app: {image: "alpine\\n%setup\\ntouch /tmp/PWNED"}}', "services.app.image"),
    ('services: {app: {image: "alpine\\u0000"}}', "services.app.image"),
    ('services: {app: {image: "alpine#x"}}', "services.app.image"),
    ('services: {app: {build: {context: ./app, args: {BASE: "alpine\\n%setup"}}}}', "services.app.build.args.BASE"),
    ('services: {app: {build: {context: ./app, args: ["BASE=alpine\\r%setup"]}}}', "services.app.build.args.BASE"),
    ('services: {app: {build: {context: ./app, dockerfile: "Docker\\nfile"}}}', "services.app.build.dockerfile"),
    ('services: {app: {build: {context: ./app, target: "a\\nb"}}}', "services.app.build.target"),
])
def test_control_characters_are_refused_naming_the_key(tmp_path, compose, path):
    project = project_at(tmp_path, compose)
    with pytest.raises(ComposeError) as info:
        images_of(project)
    assert info.value.path == path
    result = convert(tmp_path)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "compose.yaml" in result.stderr and path in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.def"))


def test_dockerfile_that_is_not_utf8_is_one_line(tmp_path):
    project_at(tmp_path, "services: {app: {build: ./app}}", dockerfile=b"FROM alpine\nRUN echo \xff\xfe\n")
    result = convert(tmp_path)
    assert result.returncode == 1 and "app/Dockerfile: line 2: not UTF-8 text" in result.stderr
    assert "services.app.build" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_empty_from_names_service_dockerfile_and_arg(tmp_path):
    project_at(tmp_path, "services: {app: {build: {context: ./app, args: [BASE]}}}",
               dockerfile="ARG BASE\nFROM $BASE\n")
    result = convert(tmp_path)
    assert result.returncode == 1, result.stderr
    line = result.stderr.strip()
    assert "services.app.build" in line and "app/Dockerfile: line 2" in line and "ARG BASE has no value" in line


@pytest.mark.parametrize("args,base", [
    ('["BASE=debian:12", "OTHER"]', "debian:12"), ('{BASE: "debian:12", OTHER: null}', "debian:12"),
    ('["BASE"]', "python:3.12-slim"), ('{BASE: null}', "python:3.12-slim"),  # no value: the ARG's default
])
def test_build_args_list_and_map_form(tmp_path, args, base):
    project = project_at(tmp_path, f"services: {{app: {{build: {{context: ./app, args: {args}}}}}}}")
    (source,) = images_of(project).values()
    assert f"From: {base}\n" in source.definition


def test_services_with_the_same_build_share_one_definition(tmp_path):
    project = project_at(tmp_path, """
        services:
          web: {build: ./app}
          worker: {build: {context: ./app}, command: python -c pass}
          beat: {build: {context: ./app, dockerfile: Dockerfile}}
          other: {build: {context: ./app, args: {BASE: "debian:12"}}}
    """)
    plan = build_plan(project, PlanOptions(port_base=30000))
    shared = [k for k, v in plan.images.items() if sorted(v.services) == ["beat", "web", "worker"]]
    assert len(shared) == 1 and len(plan.images) == 2
    other = next(v for v in plan.images.values() if v.services == ["other"])
    assert other.digest != plan.images[shared[0]].digest


BOTH = """
    services:
      app:
        image: example.org/team/app:1.0
        build: ./app
        {policy}
"""


@pytest.mark.parametrize("policy,configs,kind,note", [
    ("", None, "build", "could not be read from its registry"),            # --offline: nothing was asked
    ("", {"example.org/team/app:1.0": ImageConfig()}, "docker", "pulled, not built"),
    ("pull_policy: always", {"example.org/team/app:1.0": ImageConfig()}, "docker", "pulled, not built"),
    ("pull_policy: missing", {}, "build", "(--offline, or it is not there): built"),
    ("pull_policy: build", {"example.org/team/app:1.0": ImageConfig()}, "build", None),
])
def test_build_and_image_follow_pull_policy(tmp_path, policy, configs, kind, note):
    project = project_at(tmp_path, BOTH.format(policy=policy))
    plan = build_plan(project, PlanOptions(port_base=30000, image_configs=configs or {}))
    (image,) = plan.images.values()
    assert image.kind == kind
    if note:
        assert any(note in w and "'app'" in w for w in plan.warnings), plan.warnings
    else:
        assert not any("registry" in w for w in plan.warnings)


def test_offline_convert_says_it_built(tmp_path):
    project_at(tmp_path, BOTH.format(policy=""))
    result = convert(tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    (image,) = plan["images"].values()
    assert image["kind"] == "build" and any("built from build: instead" in w for w in plan["warnings"])
    assert "Bootstrap: docker\nFrom: python:3.12-slim" in (tmp_path / "out" / image["definition"]).read_text()


def test_build_and_image_without_a_dockerfile_pulls_offline(tmp_path):
    """A clone without the Dockerfile (or --offline): the image can only be pulled, so it is."""
    project = project_at(tmp_path, BOTH.format(policy="").replace("build: ./app", "build: ./elsewhere"))
    (source,) = images_of(project).values()
    assert source.kind == "docker" and "From: example.org/team/app:1.0\n" in source.definition
    assert any("Dockerfile cannot be read" in w and "is pulled instead" in w for w in source.warnings)
    project = project_at(tmp_path, BOTH.format(policy="pull_policy: build").replace("build: ./app",
                                                                                   "build: ./elsewhere"))
    with pytest.raises(ComposeError, match="cannot read the Dockerfile"):
        images_of(project)
    project = project_at(tmp_path, "services: {app: {build: ./elsewhere}}")
    with pytest.raises(ComposeError, match="cannot read the Dockerfile"):
        images_of(project)

"""Names Docker Compose validates, with its wording, and a fuzz test of `config` on hostile projects:
every project loads or is refused with one `compose2sif: error:` line, never a traceback."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from helpers_fuzz import hostile_projects, written_project
from oracle import base_env, oracle_mark, run_oracle, run_ours

REPO = Path(__file__).resolve().parent.parent
INVALID_NAME = ("invalid project name {}: must consist only of lowercase alphanumeric characters, hyphens, and "
                "underscores as well as start with a letter or number")


def _project(tmp_path):
    (tmp_path / "compose.yaml").write_text("services:\n  app:\n    image: a\n")
    return tmp_path


@oracle_mark()
@pytest.mark.parametrize("name, shown", [("x/../../escaped", '"x/../../escaped"'), ("x\ntouch /tmp/PWNED", '"x\\ntouch /tmp/PWNED"'),
                                         ("..", '".."'), ("a.b", '"a.b"'), ("Upper", '"Upper"'), ("-lead", '"-lead"')])
@pytest.mark.parametrize("source", ["-p", "COMPOSE_PROJECT_NAME"])
def test_project_names_refused_as_compose_refuses_them(tmp_path, name, shown, source):
    cwd = _project(tmp_path)
    args, env = (["-p", name], base_env({})) if source == "-p" else ([], base_env({"COMPOSE_PROJECT_NAME": name}))
    rc, _, oracle_err = run_oracle(args, cwd, env)
    assert rc != 0
    rc, _, err = run_ours(args, cwd, env)
    assert rc != 0
    expected = INVALID_NAME.format(shown)
    assert expected in oracle_err
    assert err.strip() == f"compose2sif: error: {expected}"


@oracle_mark()
@pytest.mark.parametrize("name", ["a", "a_b-c9", "0lead", "trail-"])
def test_valid_project_names_are_used_as_given(tmp_path, name):
    cwd = _project(tmp_path)
    rc, theirs, err = run_oracle(["-p", name], cwd, base_env({}))
    assert rc == 0, err
    rc, ours, err = run_ours(["-p", name], cwd, base_env({}))
    assert rc == 0, err
    assert ours["name"] == theirs["name"] == name


# ---- fuzz (the projects: helpers_fuzz.py) ---------------------------------------------------


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(project=hostile_projects())
def test_config_of_a_hostile_project_loads_or_fails_with_one_line(tmp_path_factory, project):
    text, dotenv, project_name = project
    work = written_project(tmp_path_factory, text, dotenv)
    options = ProjectOptions(cwd=str(work), project_name=project_name or None,
                             environ={"PATH": "/usr/bin:/bin", "HOME": str(work)})
    try:
        loaded = load_project(options)
    except ComposeError as exc:
        message = str(exc)
        assert message and "\n" not in message and "Traceback" not in message
        return
    json.dumps(loaded.config)  # `config --format json` and the YAML format print this
    yaml.safe_dump(loaded.config, allow_unicode=True)


@pytest.mark.parametrize("text", ["services:\n  ../../x:\n    image: a\n", "services: [\n", "services:\n  a: 1\n",
                                  "services:\n  a:\n    image: a\n    command: 'unclosed\n",
                                  "x-deep: " + "[" * 3000 + "]" * 3000 + "\nservices:\n  a:\n    image: a\n"])
def test_the_command_line_prints_one_error_line(tmp_path, text):
    (tmp_path / "compose.yaml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "config", "--format", "json"], cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("compose2sif: error: "), proc.stderr


def test_a_dependency_chain_longer_than_the_recursion_limit_loads(tmp_path):
    """The cycle check walks depends_on without recursion. (Not a corpus case: the planner's own
    walk of this chain is another matter, see issue 11.)"""
    lines = ["services:"]
    for i in range(1500):
        lines += [f"  s{i}:", "    image: a"] + ([f"    depends_on: [s{i + 1}]"] if i < 1499 else [])
    (tmp_path / "compose.yaml").write_text("\n".join(lines) + "\n")
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"PATH": "/usr/bin:/bin"}))
    assert len(project.config["services"]) == 1500
    assert project.config["services"]["s0"]["depends_on"] == {"s1": {"condition": "service_started", "required": True}}


# ---- names the engine or Apptainer would refuse at start, refused at load time --------------------

@pytest.mark.parametrize("key, value, wording", [
    ("container_name", "--all", "services.app.container_name: '--all' does not match pattern "
                                "'[a-zA-Z0-9][a-zA-Z0-9_.-]+'"),
    ("container_name", "x" * 251, "services.app.container_name: instance name"),
    ("hostname", "--all", "services.app.hostname: '--all' does not match pattern '[a-zA-Z0-9_][a-zA-Z0-9_.-]*'"),
    ("hostname", 'web c"$(touch x)"', "services.app.hostname: 'web c\"$(touch x)\"' does not match pattern"),
    ("hostname", "h" * 65, "services.app.hostname: \"" + "h" * 40 + "...\" is 65 characters long; at most 64"),
    ("extra_hosts", ["-x:1.2.3.4"], "services.app.extra_hosts: '-x' does not match pattern"),
    ("extra_hosts", ["x:1.2.3.4 evil"], 'services.app.extra_hosts: invalid IP address in add-host: "1.2.3.4 evil"'),
    ("networks", {"default": {"aliases": ["a b"]}}, "services.app.networks.default.aliases: 'a b' does not match"),
])
def test_names_refused_at_load_time_in_one_line(tmp_path, key, value, wording):
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump({"services": {"app": {"image": "a", key: value}}}))
    with pytest.raises(ComposeError) as caught:
        load_project(ProjectOptions(cwd=str(tmp_path), environ={"PATH": "/usr/bin:/bin"}))
    message = str(caught.value)
    assert wording in message and message.startswith(f"{tmp_path / 'compose.yaml'}:"), message


def test_a_service_name_too_long_for_a_file_name_is_refused(tmp_path):
    (tmp_path / "compose.yaml").write_text(f"services:\n  {'a' * 300}:\n    image: a\n")
    with pytest.raises(ComposeError, match="service name is 300 characters long; at most 200"):
        load_project(ProjectOptions(cwd=str(tmp_path), environ={"PATH": "/usr/bin:/bin"}))


@oracle_mark()
def test_container_name_refused_by_the_schema_is_worded_as_compose_words_it(tmp_path):
    (tmp_path / "compose.yaml").write_text("services:\n  app:\n    image: a\n    container_name: 'a b'\n")
    rc, _, theirs = run_oracle([], tmp_path, base_env({}))
    assert rc != 0 and "services.app.container_name 'a b' does not match pattern '[a-zA-Z0-9][a-zA-Z0-9_.-]+'" in theirs
    rc, _, ours = run_ours([], tmp_path, base_env({}))
    assert rc != 0 and "services.app.container_name: 'a b' does not match pattern '[a-zA-Z0-9][a-zA-Z0-9_.-]+'" in ours

"""The command line as a user meets it: global options, output formats, one-line errors."""
import json
import os
from pathlib import Path

import yaml

from helpers import compose2sif_forked

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "corpus"
STACKS = REPO / "stacks"


def run(*args, cwd=REPO, env=None):
    full_env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONPATH": str(REPO), **(env or {})}
    return compose2sif_forked(list(args), cwd, full_env)


def test_services_and_profiles_listing():
    out = run("--profile", "gpu", "config", "--services", cwd=CORPUS / "profiles")
    assert out.returncode == 0
    assert sorted(out.stdout.split()) == ["app", "db", "gpu-worker"]
    out = run("config", "--profiles", cwd=CORPUS / "profiles")
    assert out.stdout.split() == ["all", "debug", "gpu", "tools"]


def test_yaml_is_the_default_format_and_equals_json():
    as_yaml = run("config", cwd=STACKS / "llm-chat")
    as_json = run("config", "--format", "json", cwd=STACKS / "llm-chat")
    assert as_yaml.returncode == 0 and as_json.returncode == 0
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_global_options(tmp_path):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "main.yaml").write_text("services:\n  app:\n    image: app:${TAG}\n"
                                                 "    volumes: [./data:/data]\n")
    (tmp_path / "custom.env").write_text("TAG=from-custom-env\n")
    out = run("-f", "proj/main.yaml", "--env-file", "custom.env", "-p", "demo",
              "--project-directory", str(tmp_path), "config", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == "demo"
    assert doc["services"]["app"]["image"] == "app:from-custom-env"
    assert doc["services"]["app"]["volumes"][0]["source"] == str(tmp_path / "data")


def test_compose_file_from_environment(tmp_path):
    (tmp_path / "a.yaml").write_text("services:\n  a:\n    image: a\n")
    (tmp_path / "b.yaml").write_text("services:\n  b:\n    image: b\n")
    out = run("config", "--services", cwd=tmp_path, env={"COMPOSE_FILE": "a.yaml,b.yaml",
                                                         "COMPOSE_PATH_SEPARATOR": ","})
    assert sorted(out.stdout.split()) == ["a", "b"]


def test_bad_input_is_one_line_and_nonzero(tmp_path):
    (tmp_path / "compose.yaml").write_text("services:\n  app:\n    image: a\n    ports: ['80:80:80:80/tcp/x']\n")
    out = run("config", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"compose2sif: error: {tmp_path}/compose.yaml:4: services.app.ports")


def test_no_compose_file_found(tmp_path):
    out = run("config", cwd=tmp_path)
    assert out.returncode == 1 and "no configuration file provided" in out.stderr
    assert "Traceback" not in out.stderr


def test_option_values_may_start_with_a_dash_as_in_docker_compose():
    from compose2sif.cli import _attach_values, _parser
    argv = ["-p", "-lead", "--env-file", "-x.env", "exec", "-o", "-out", "api", "ls", "-p", "--", "-o", "x"]
    parser = _parser(argv)
    attached = _attach_values(parser, argv)
    # exec's command is passed on verbatim; the values before it are attached to their options
    assert attached == ["-p-lead", "--env-file=-x.env", "exec", "-o-out", "api", "ls", "-p", "--", "-o", "x"]
    args = parser.parse_args(attached)
    assert (args.project_name, args.env_files, args.output, args.service) == ("-lead", ["-x.env"], "-out", "api")
    assert args.command == ["ls", "-p", "--", "-o", "x"]


def test_restart_passes_its_services_to_run_sh(tmp_path):
    """As logs, exec and down: the generated run.sh does the work, here with the RECORDING STAND-IN
    (tests/standins/recording-standin-apptainer) as its runtime, which runs nothing."""
    (tmp_path / "compose.yaml").write_text("name: r\nservices:\n  db:\n    image: busybox\n")
    assert run("convert", "--offline", "-o", "out", cwd=tmp_path).returncode == 0
    env = {"C2S_RUNTIME": str(REPO / "tests" / "standins" / "recording-standin-apptainer"),
           "C2S_RECORD": str(tmp_path / "record"), "HOME": str(tmp_path)}
    out = run("restart", "-o", "out", "nosuch", cwd=tmp_path, env=env)
    assert out.returncode == 1 and out.stderr.strip() == "run.sh: no such service: nosuch (services: db)", out.stderr
    out = run("restart", "-o", "out", cwd=tmp_path, env=env)  # nothing was started: nothing to restart
    assert out.returncode == 0 and "restart: no service was started since `down`" in out.stderr, out.stderr

"""pre_start (Compose's init containers): what the planner decides for each step (plan.json, the env
files, run.sh's data), and what `up`, `restart` and `down` of run.sh ask of the runtime for them. The
runtime is the RECORDING STAND-IN (tests/standins/recording-standin-apptainer) in its running mode;
one test wraps it in a FAILING-STEP STAND-IN (written below) whose `exec` of one step fails. Real
Apptainer runs the steps in tests/e2e/test_pre_start_e2e.py."""
import json
import os

import pytest

from compose2sif.errors import ComposeError
from helpers import STANDIN, converted_on_standin as converted, recorded_calls
from test_plan import plan_for

COMPOSE = """
services:
  app:
    image: example.org/app:1
    entrypoint: ["/entry.sh"]
    command: ["serve"]
    working_dir: /srv
    environment: {GREETING: hello, DB: "db:5432"}
    volumes: [data:/shared, {type: tmpfs, target: /scratch}]
    pre_start:
      - image: example.org/tools:2
        command: ["sh", "-c", "echo $$GREETING > /shared/init.txt"]
        environment: {STEP: one}
        user: root
      - command: ["migrate"]
        working_dir: /srv/db
  db:
    image: example.org/db:1
volumes: {data: {}}
"""


def test_each_step_is_planned_with_its_image_command_environment_and_fingerprint(tmp_path):
    plan = plan_for(tmp_path, COMPOSE)
    app = plan.service("app")
    tools, own = app.pre_start
    assert tools.image != app.image and plan.images[tools.image].ref == "example.org/tools:2"
    assert plan.images[tools.image].steps == ["app pre_start[0]"] and plan.images[tools.image].services == []
    # another image: its own ENTRYPOINT (the runscript); the service's image: the service's entrypoint
    assert tools.launch == ["/.singularity.d/runscript", "sh", "-c", "echo $GREETING > /shared/init.txt"]
    assert own.image == app.image and own.launch == ["/entry.sh", "migrate"]
    assert tools.environment["GREETING"] == "hello" and tools.environment["STEP"] == "one"
    assert "STEP" not in own.environment and own.environment["DB"] == app.environment["DB"]
    assert (tools.workdir, own.workdir) == ("/srv", "/srv/db")
    assert tools.env_file == "env/app.pre_start.0.env" and len({tools.fingerprint, own.fingerprint}) == 2
    assert any("pre_start[0]: user 'root' is ignored" in w for w in plan.warnings)
    assert not any("`pre_start` is not supported" in w for w in plan.warnings)  # the old warning is gone
    # a change of a step changes its fingerprint only
    changed = plan_for(tmp_path, COMPOSE.replace("STEP: one", "STEP: two"))
    assert changed.service("app").pre_start[0].fingerprint != tools.fingerprint
    assert changed.service("app").pre_start[1].fingerprint == own.fingerprint


def test_a_step_naming_an_image_another_service_builds_runs_that_services_sif(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example.org/app:1
            pre_start: [{image: local/tools:1, command: ["true"]}]
          tools:
            image: local/tools:1
            build: ./tools
        """, files={"tools/Dockerfile": "FROM busybox\n"})
    assert plan.service("app").pre_start[0].image == plan.service("tools").image


def test_a_step_image_with_a_newline_is_refused_with_its_key(tmp_path):
    with pytest.raises(ComposeError) as err:
        plan_for(tmp_path, """
            services:
              app:
                image: example.org/app:1
                pre_start: [{image: "bad\\nFrom: evil", command: ["true"]}]
            """)
    assert "services.app.pre_start[0].image" in str(err.value)


def step_runs(tmp_path):
    """The recorded `exec`s of pre_start steps: (env file, SIF)."""
    runs = recorded_calls(tmp_path)
    return [(c[c.index("--env-file") + 1], c[-2]) for c in runs
            if c[:1] == ["exec"] and c[-1] == "/.singularity.d/startscript" and ".pre_start." in " ".join(c)]


def test_up_runs_each_step_once_before_the_service_and_again_only_after_down_or_a_change(tmp_path):
    out, run = converted(tmp_path, COMPOSE)
    try:
        proc = run("up", "-d", "app")
        assert proc.returncode == 0, proc.stderr
        runs = step_runs(tmp_path)
        plan = json.loads((out / "plan.json").read_text())
        app = next(s for s in plan["services"] if s["name"] == "app")
        sif = lambda key: str(out / "sif" / f"{key}.sif")  # noqa: E731
        assert runs == [(str(out / "env" / "app.pre_start.0.env"), sif(app["pre_start"][0]["image"])),
                        (str(out / "env" / "app.pre_start.1.env"), sif(app["image"]))]
        text = (tmp_path / "record").read_text()
        assert text.index(".pre_start.1.env") < text.index("instance\0start")  # the steps ran first
        step = next(c.split("\0") for c in text.split("\036") if "app.pre_start.0.env" in c)
        assert f"{out}/state/volumes/data:/shared" in step  # the service's volume, shared
        env0 = (out / "env" / "app.pre_start.0.env").read_text()
        assert "GREETING=hello" in env0 and "STEP=one" in env0 and "C2S_LAUNCH=" in env0
        assert (out / "env" / "app.pre_start.0.env").stat().st_mode & 0o777 == 0o600
        # a restart and a later `up` do not run them again
        assert run("restart", "app").returncode == 0
        assert run("up", "-d", "app").returncode == 0
        assert len(step_runs(tmp_path)) == 2
        # after `down` they run again, as for Compose's new containers
        assert run("down").returncode == 0 and not (out / "state" / "pre_start").exists()
        assert run("up", "-d", "app").returncode == 0
        assert len(step_runs(tmp_path)) == 4
        # a step that changed runs again, alone, at the service's next start
        converted(tmp_path, COMPOSE.replace("STEP: one", "STEP: two"))
        assert run("restart", "app").returncode == 0
        assert [os.path.basename(env) for env, _ in step_runs(tmp_path)[4:]] == ["app.pre_start.0.env"]
    finally:
        run("down")


FAILING = """#!/usr/bin/env bash
# FAILING-STEP STAND-IN, for this test only: the recording stand-in, except that the `exec` of
# pre_start step 1 of app prints its error, then a line of the runtime's, and exits 17.
case " $* " in
    *"app.pre_start.1.env"*) "{standin}" "$@"; echo "migration 3 failed" >&2; echo "INFO: cleaning up"; exit 17 ;;
esac
exec "{standin}" "$@"
"""


def test_a_failing_step_fails_up_in_one_line_naming_the_service_and_the_step(tmp_path):
    failing = tmp_path / "failing-step-standin"
    failing.write_text(FAILING.replace("{standin}", str(STANDIN)))
    failing.chmod(0o755)
    out, run = converted(tmp_path, COMPOSE, runtime=failing)
    try:
        proc = run("up", "-d", "app")
        assert proc.returncode == 1
        lines = [line for line in proc.stderr.splitlines() if line.startswith("run.sh:")]
        assert lines == ["run.sh: service app failed: pre_start[1] exited with code 17: migration 3 failed "
                         "(output: state/logs/app.pre_start.1.log)"], proc.stderr
        assert "migration 3 failed" in (out / "state" / "logs" / "app.pre_start.1.log").read_text()
        assert not (tmp_path / "instances" / "proj-app").exists()  # the service did not start
        # step 0 succeeded and is not run again; step 1 is
        assert (out / "state" / "pre_start" / "app" / "0").exists()
        assert not (out / "state" / "pre_start" / "app" / "1").exists()
        run("up", "-d", "app")
        assert [os.path.basename(env) for env, _ in step_runs(tmp_path)] == \
            ["app.pre_start.0.env", "app.pre_start.1.env", "app.pre_start.1.env"]
    finally:
        run("down")

"""pre_start on real rootless Apptainer as the unprivileged user: a step of another image (its own
SIF) writes into a named volume before its service starts and reads it; a restart and a later `up`
do not run it again, `down` then `up` does (Compose's new containers); a failing step fails `up`
in one line naming the service and the step, and the service does not start."""
import pytest

pytestmark = pytest.mark.e2e

OUT = "out-prestart"


def test_a_step_writes_into_a_shared_volume_before_its_service_starts_and_runs_once(node):
    node.copy_stack("pre-start-stack", source="pre-start-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    lines = lambda: node.run(f"cd ~ && {OUT}/run.sh exec app cat /shared/init.txt",  # noqa: E731
                             timeout=120).stdout.splitlines()
    try:
        proc = node.c2s(f"-f pre-start-stack/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}",
                        timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "running pre_start[0]" in proc.stderr and "running pre_start[1]" in proc.stderr, proc.stderr
        first = lines()
        # the step had the service's environment and its own, and the service's working directory
        assert first == ["initialized by step-0 in /srv"], first
        logs = node.run(f"cd ~ && {OUT}/run.sh logs app", timeout=60)
        assert "initialized by step-0" in logs.stdout + logs.stderr  # the service read it at its start
        restart = node.run(f"cd ~ && {OUT}/run.sh restart app", timeout=300)
        assert restart.returncode == 0 and "pre_start" not in restart.stderr, restart.stderr
        again = node.run(f"cd ~ && {OUT}/run.sh up -d", timeout=300)
        assert again.returncode == 0 and "pre_start" not in again.stderr, again.stderr
        assert lines() == first
        node.run(f"cd ~ && {OUT}/run.sh down", check=True, timeout=120)
        node.run(f"cd ~ && {OUT}/run.sh up -d", check=True, timeout=300)
        assert lines() == first * 2  # the volume is kept, the steps ran again for the new start
    finally:
        node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=120)


def test_a_failing_step_fails_up_in_one_line_and_the_service_does_not_start(node):
    node.copy_stack("pre-start-stack", source="pre-start-stack")
    out = f"{OUT}-fail"
    node.run(f"cd ~ && rm -rf {out}")
    try:
        proc = node.c2s(f"-f pre-start-stack/compose.fail.yaml up -d --registry-mirror {node.registry} -o {out}",
                        timeout=900)
        assert proc.returncode != 0
        said = [line for line in proc.stderr.splitlines() if line.startswith("run.sh: service app failed")]
        assert said == ["run.sh: service app failed: pre_start[0] exited with code 17: schema migration failed "
                        "(output: state/logs/app.pre_start.0.log)"], proc.stderr
        listing = node.run("apptainer instance list", timeout=60)
        assert "c2s-prestart-fail" not in listing.stdout
    finally:
        node.run(f"cd ~ && {out}/run.sh down", timeout=120)

"""Recovery on a real rootless Apptainer, as an unprivileged user: after kill -9 of every process of
a running stack, after a reboot (everything killed and the runtime's instance records gone, while
run.sh's own records, on disk, name pids that may be anybody's now), and after the runtime's FUSE
helpers were killed, `ps`, `up` and `down` see what is left, say so in one line, and clean it up;
`up` and `down` twice are idempotent; a foreground `up` ends with `down`; `up` tells its progress
in plain lines when stderr is not a terminal, and redraws one block when it is."""
import json
import re
import subprocess
import time

import pytest

pytestmark = pytest.mark.e2e

OUT = "out-recovery"
PROJECT = "c2s-recovery"
LONG_RUNNING = ("cache", "db", "api", "worker", "proxy")
# a supervisor stand-in: a process of the user whose command line looks like another project's
# supervisor, standing where a pid recorded before a "reboot" now points
STANDIN = "elsewhere/run.sh _supervise"


@pytest.fixture(scope="module")
def rec(node):
    node.copy_stack("plain-stack", source="plain-stack")
    # a restart policy, so that `up -d` leaves a supervisor behind
    (node.home / "plain-stack" / "recovery.yaml").write_text("services:\n  cache:\n    restart: always\n")
    subprocess.run(["chown", f"{node.uid}:{node.uid}", str(node.home / "plain-stack" / "recovery.yaml")], check=True)
    node.run(f"cd ~ && rm -rf {OUT}")
    proc = node.c2s(f"-p {PROJECT} -f plain-stack/compose.yaml -f plain-stack/recovery.yaml convert "
                    f"--registry-mirror {node.registry} -o {OUT}", timeout=300)
    assert proc.returncode == 0, proc.stderr
    node.run(f"cd ~ && {OUT}/run.sh build", timeout=1500, check=True)
    yield node
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def run_sh(node, args, timeout=600):
    return node.run(f"cd ~ && {OUT}/run.sh {args}", timeout=timeout)


def ps(node):
    proc = run_sh(node, "ps --format json")
    assert proc.returncode == 0, proc.stderr
    return {s["service"]: s for s in json.loads(proc.stdout)}, proc.stderr


def instance_pids(node):
    out = node.run("apptainer instance list --json", check=True).stdout
    return {i["instance"]: i["pid"] for i in json.loads(out)["instances"]}


def supervisors(node):
    """The sessions of this project's supervisors (a supervisor's own forks share its session)."""
    out = subprocess.run(["ps", "-u", node.uid, "-ww", "-o", "sid=,args="], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if f"{OUT}/run.sh _supervise" in line}


def up_healthy(node):
    proc = run_sh(node, "up -d", timeout=900)
    assert proc.returncode == 0, proc.stderr
    for _ in range(150):  # `up -d` waits only where a dependent asks: health may still be starting
        state, _ = ps(node)
        if all(state[name]["health"] == "healthy" for name in ("db", "api", "worker")):
            break
        time.sleep(0.2)
    for name in LONG_RUNNING:
        assert state[name]["state"] == "running", state[name]
    for name in ("db", "api", "worker"):
        assert state[name]["health"] == "healthy", state[name]
    return proc


def assert_nothing_left(node, keep=()):
    """No process of hpc (zombies aside: the node's init reaps them), no instance, no FUSE mount."""
    for _ in range(50):
        left = [p for p in node.processes()
                if "<defunct>" not in p and not re.search(r"\bps -u\b", p) and not any(k in p for k in keep)]
        if not left:
            break
        time.sleep(0.2)
    assert left == []
    assert instance_pids(node) == {}
    assert not re.search(r"fuse|squashfuse", open("/proc/mounts").read())
    assert node.run("grep -c fuse /proc/self/mountinfo").stdout.strip() == "0"


def test_up_tells_progress_in_plain_lines_in_order(rec):
    node = rec
    proc = up_healthy(node)
    lines = [line for line in proc.stderr.splitlines() if line.startswith(f"[{PROJECT}] ")]
    assert "\x1b[" not in proc.stderr  # not a terminal: no cursor movement

    def order(name, *states):
        got = [i for i, line in enumerate(lines) for s in states if line.startswith(f"[{PROJECT}] {name}: {s}")]
        assert len(got) == len(states) and got == sorted(got), (name, states, lines)

    order("db", "starting instance c2s-recovery-db", "waiting for health", "healthy")
    order("init", "waiting for db (healthy)", "running to completion", "completed")
    order("api", "waiting for init (completed successfully), cache (started)", "starting instance", "waiting for health",
          "healthy")
    order("proxy", "waiting for api (healthy), worker (healthy)", "starting instance", "running")
    order("cache", "starting instance", "running")
    assert lines[-3].startswith(f"[{PROJECT}] up: cache db init api worker proxy"), lines


def test_up_on_a_terminal_redraws_one_block(rec):
    node = rec
    # `script` gives run.sh a terminal; the services already run, so the block settles at once
    proc = node.run(f"cd ~ && TERM=xterm script -qec '{OUT}/run.sh up -d' /dev/null", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "\x1b[6A" in out  # the block of six services drawn again in place
    final = out[out.rindex("\x1b[6A"):]
    for name, settled in (("cache", "already running"), ("db", "healthy"), ("init", "completed"), ("api", "healthy"),
                          ("worker", "healthy"), ("proxy", "already running")):
        assert f"\x1b[K[{PROJECT}] {name}: {settled}\n" in final, final  # (\r read as \n)


def test_up_twice_is_idempotent(rec):
    node = rec
    before = instance_pids(node)
    assert len(supervisors(node)) == 1
    proc = run_sh(node, "up -d", timeout=600)
    assert proc.returncode == 0, proc.stderr
    for name in LONG_RUNNING:
        assert f"[{PROJECT}] {name}: already running" in proc.stderr
    assert "starting instance" not in proc.stderr
    assert instance_pids(node) == before  # nothing started twice
    assert len(supervisors(node)) == 1, supervisors(node)  # the old supervisor made way for one new one


def test_kill_9_of_the_whole_stack_then_ps_up_down(rec):
    node = rec
    node.kill_all()  # every process of the user: instances, services, supervisor, FUSE helpers
    state, notes = ps(node)
    for name in LONG_RUNNING:
        assert state[name]["state"] == "exited", state[name]
    assert (f"[{PROJECT}] cache db api worker proxy: ended without `down` (killed, or the node rebooted): "
            "no instance is left; `up` starts them again") in notes
    assert "the supervisor (pid" in notes and "has gone without `down`" in notes
    proc = up_healthy(node)  # `ps` only reports; `up` clears the records
    assert (f"[{PROJECT}] cache db api worker proxy: ended without `down` (killed, or the node rebooted): "
            "their records are cleared") in proc.stderr
    assert len(supervisors(node)) == 1
    assert node.run("curl -fsS http://127.0.0.1:18090/api/health").returncode == 0
    proc = run_sh(node, "down", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_nothing_left(node)


def test_reboot_with_records_naming_reused_pids(rec):
    node = rec
    up_healthy(node)
    node.kill_all()
    node.run("rm -rf ~/.apptainer/instances/app", check=True)  # the runtime's records gone, ours kept
    # the pid in supervisor.pid now belongs to someone else (here: the stand-in, another "supervisor")
    node.run(f"setsid -f bash -c 'exec -a \"bash /home/hpc/{STANDIN}\" sleep 600' </dev/null >/dev/null 2>&1",
             check=True, timeout=30)
    standin = next(p for p in node.processes() if STANDIN in p).split()[0]
    run_dir = node.home / OUT / "state" / "run"
    (run_dir / "supervisor.pid").write_text(f"{standin} 12345\n")
    for name in ("db", "api", "worker"):  # health results recorded for pids that are not instances now
        (run_dir / f"{name}.health").write_text(f"{int(time.time())} {standin} healthy\n")
    state, notes = ps(node)
    for name in LONG_RUNNING:
        assert state[name]["state"] == "exited" and state[name]["health"] == "none", state[name]
    assert f"the supervisor (pid {standin}) has gone without `down`" in notes
    (run_dir / "supervisor.pid").write_text(f"{standin} 12345\n")  # `ps` forgot it: again, for `up`
    proc = up_healthy(node)
    assert f"the supervisor (pid {standin}) has gone without `down`" in proc.stderr
    assert any(STANDIN in p for p in node.processes()), "up signalled a process that only reused a recorded pid"
    assert len(supervisors(node)) == 1
    for _ in range(2):  # down twice: the second finds nothing and says nothing is wrong
        proc = run_sh(node, "down", timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert "stopping" not in proc.stderr and "ended without" not in proc.stderr, proc.stderr
    assert_nothing_left(node, keep=(STANDIN,))
    node.run(f"kill {standin}")


def test_killed_fuse_helpers_count_as_exited_and_up_brings_them_back(rec):
    node = rec
    up_healthy(node)
    before = instance_pids(node)
    # no supervisor, so that nothing restarts `cache` (restart: always) behind `ps` and `up`
    node.run(f"kill -9 $(cut -d' ' -f1 ~/{OUT}/state/run/supervisor.pid)", check=True)
    # the image and writable-root mounts die; the services' processes live on without a root filesystem
    node.run("pkill -9 -u hpc -x squashfuse_ll; pkill -9 -u hpc -x fuse-overlayfs")
    state, notes = ps(node)
    for name in LONG_RUNNING:
        assert state[name]["state"] == "exited", state[name]
        assert (f"[{PROJECT}] {name}: its root filesystem is gone (a FUSE helper of the runtime was killed: "
                "\"Transport endpoint is not connected\"); counted as exited; `up` starts it again") in notes
    proc = up_healthy(node)
    assert f"[{PROJECT}] db: its root filesystem is gone" in proc.stderr and "its instance is removed" in proc.stderr
    assert "already running" not in proc.stderr
    after = instance_pids(node)
    assert all(after[i] != before[i] for i in before), (before, after)  # each instance made anew
    assert node.run("curl -fsS http://127.0.0.1:18090/api/health").returncode == 0
    run_sh(node, "down", timeout=300)
    assert_nothing_left(node)


def test_supervisor_restarts_a_service_whose_root_filesystem_went(rec):
    node = rec
    up_healthy(node)
    before = instance_pids(node)
    node.run("pkill -9 -u hpc -x squashfuse_ll; pkill -9 -u hpc -x fuse-overlayfs")
    for _ in range(100):  # cache has `restart: always`: its instance is removed and made anew
        state, _ = ps(node)
        if state["cache"]["state"] == "running":
            break
        time.sleep(0.2)
    assert state["cache"]["state"] == "running", state["cache"]
    assert instance_pids(node)[f"{PROJECT}-cache"] != before[f"{PROJECT}-cache"]
    assert "restarting (restart: always)" in (node.home / OUT / "state" / "logs" / "supervisor.log").read_text()
    # it runs in its image's working directory, which the image lacks and the start made, as Docker does
    assert node.run(f"cd ~ && {OUT}/run.sh exec cache sh -c pwd").stdout.strip() == "/data"
    run_sh(node, "down", timeout=300)
    assert_nothing_left(node)


def test_foreground_up_ends_with_down(rec):
    node = rec
    node.run(f"cd ~ && setsid -f {OUT}/run.sh up </dev/null >fg-up.log 2>&1", check=True, timeout=30)
    for _ in range(300):
        log = (node.home / "fg-up.log").read_text()
        if f"[{PROJECT}] up: " in log or "failed" in log:
            break
        time.sleep(0.2)
    assert f"[{PROJECT}] up: " in log, log
    assert any(f"{OUT}/run.sh up" in p for p in node.processes())
    proc = run_sh(node, "down", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert_nothing_left(node)  # the foreground `up` (this project's supervisor) too
    assert f"[{PROJECT}] up: ended by another run.sh up or down" in (node.home / "fg-up.log").read_text()


def test_two_ups_at_once_start_each_service_once_and_down_waits_for_up(rec):
    node = rec
    node.run(f"cd ~ && for x in a b; do ({OUT}/run.sh up -d >up-$x.log 2>&1; echo $? >up-$x.rc) & done; wait",
             timeout=900, check=True)
    logs = [(node.home / f"up-{x}.log").read_text() for x in "ab"]
    assert [(node.home / f"up-{x}.rc").read_text().strip() for x in "ab"] == ["0", "0"], logs
    assert sum("waiting for `up` of this project (pid " in log for log in logs) == 1, logs
    for name in LONG_RUNNING:  # the second `up` ran after the first: everything was running by then
        assert "".join(logs).count(f"[{PROJECT}] {name}: starting instance") == 1, logs
    assert len(supervisors(node)) == 1
    assert run_sh(node, "down", timeout=300).returncode == 0
    # `down` typed while `up` is still starting the stack: it waits for `up`, then removes all of it
    node.run(f"cd ~ || exit; ({OUT}/run.sh up -d >up-a.log 2>&1; echo $? >up-a.rc) & sleep 1; "
             f"{OUT}/run.sh down >down.log 2>&1; echo $? >down.rc; wait", timeout=900, check=True)
    down_log = (node.home / "down.log").read_text()
    assert (node.home / "down.rc").read_text().strip() == "0", down_log
    assert "waiting for `up` of this project (pid " in down_log, down_log
    assert (node.home / "up-a.rc").read_text().strip() == "0", (node.home / "up-a.log").read_text()
    assert_nothing_left(node)

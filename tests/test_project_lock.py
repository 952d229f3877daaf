"""One `up`, `down`, `restart`, `build` or `pull` of a project at a time (run/lib/lock.sh
take_project_lock), without a container runtime: the runtime is the RECORDING STAND-IN, as in
tests/test_ps_down.py (the fixture `project`, conftest.py). Two at once on the real runtime:
tests/e2e/test_recovery.py."""
import os
import re
import subprocess
import time
from pathlib import Path


def lock_path(tmp_path: Path) -> Path:
    state = re.search(r'^STATE="\$HERE/(.+)"$', (tmp_path / "out" / "run.sh").read_text(), re.M).group(1)
    return tmp_path / "out" / state / "run" / "lock"


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def test_down_waits_for_the_command_holding_the_lock_then_runs(project):
    tmp_path, run, _ = project
    run("ps")  # creates the state directories
    lock = lock_path(tmp_path)
    holder = subprocess.Popen(["sleep", "300"])  # stands in for a run.sh `up` that is starting services
    try:
        os.symlink(f"{holder.pid} {start_time(holder.pid)} up", lock)
        started = time.monotonic()
        ender = subprocess.Popen(["bash", "-c", f"sleep 1.5; kill {holder.pid}"])
        result = run("down")
        ender.wait()
        assert result.returncode == 0, result.stderr
        assert f"waiting for `up` of this project (pid {holder.pid}) to finish" in result.stderr
        assert result.stderr.count("waiting for") == 1  # said once, not once per poll
        assert time.monotonic() - started >= 1.4  # it ran only after the holder had ended
        assert not os.path.lexists(lock)  # and gave the lock back
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_command_is_taken_over_at_once(project):
    tmp_path, run, _ = project
    run("ps")
    lock = lock_path(tmp_path)
    # this pid lives, but started at another time than the lock says: the pid names another process now
    os.symlink(f"{os.getpid()} 1 up", lock)
    started = time.monotonic()
    result = run("down")
    assert result.returncode == 0, result.stderr
    assert "waiting" not in result.stderr and time.monotonic() - started < 5
    assert not os.path.lexists(lock)


def test_ps_runs_beside_a_held_lock(project):
    tmp_path, run, _ = project
    run("ps")
    lock = lock_path(tmp_path)
    os.symlink(f"{os.getpid()} {start_time(os.getpid())} up", lock)
    result = run("ps")
    assert result.returncode == 0 and "waiting" not in result.stderr, result.stderr
    assert os.readlink(lock) == f"{os.getpid()} {start_time(os.getpid())} up"  # not taken, not removed


def test_a_lock_that_cannot_be_made_ends_the_command_in_one_line(project):
    tmp_path, run, _ = project
    run("ps")
    lock = lock_path(tmp_path)
    lock.write_text("not a link\n")  # something that is no lock of run.sh's, in the lock's place
    started = time.monotonic()
    result = run("down")
    assert result.returncode == 1 and time.monotonic() - started < 30
    assert f"cannot make the lock {lock}" in result.stderr, result.stderr
    assert lock.read_text() == "not a link\n"  # left as it was

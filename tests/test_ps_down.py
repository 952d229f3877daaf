"""run.sh's `ps` table and `down` of a process tree, without a container runtime: the runtime is the
RECORDING STAND-IN (tests/standins/recording-standin-apptainer), whose `instance list --json` answers
what the test writes; the "instances" are STAND-IN PROCESS TREES of this machine shaped as
Apptainer's (a starter named "Apptainer instance: USER [NAME]", its init, the init's start script,
a FUSE driver beside the init). The real runtime runs these on the test bed (tests/e2e/test_e2e.py)."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# the fixture `project` (conftest.py): a converted project whose run.sh runs on the stand-in

def instance_tree(tmp_path, name):
    """A STAND-IN instance: starter (argv[0] as Apptainer names it) -> init -> start script (which
    passes SIGTERM on, as run.sh's launch does) -> service, and a FUSE driver stand-in beside the
    init. Returns the starter's Popen and the init's pid."""
    (tmp_path / "script.sh").write_text("trap 'kill $c' TERM; sleep 300 & c=$!; wait\n")
    (tmp_path / "init.sh").write_text(f"bash {tmp_path}/script.sh; exec sleep 300\n")  # an init outlives its script
    read, write = os.pipe()
    (tmp_path / "starter.sh").write_text(f"sleep 300 & bash {tmp_path}/init.sh & echo $! >&{write}; wait\n")
    starter = subprocess.Popen(["bash", "-c", f'exec -a "Apptainer instance: u [{name}]" bash {tmp_path}/starter.sh'],
                               pass_fds=(write,), start_new_session=True)
    os.close(write)
    init = int(os.read(read, 64).split()[0])
    os.close(read)
    for _ in range(100):  # until the init has its start script, and that its service
        kids = Path(f"/proc/{init}/task/{init}/children").read_text().split()
        if kids and Path(f"/proc/{kids[0]}/task/{kids[0]}/children").read_text().split():
            break
        time.sleep(0.02)
    return starter, init


def alive(pid):
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
    except FileNotFoundError:
        return False


def tree(pid):
    out = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        for kid in (task / "children").read_text().split():
            out += tree(int(kid))
    return out


def test_ps_table_and_json_have_address_port_and_uptime(project):
    tmp_path, run, listing = project
    starter, init = instance_tree(tmp_path, "t-db")
    try:
        listing.write_text(json.dumps({"instances": [{"instance": "t-db", "pid": init, "img": "x"}]}))
        time.sleep(1.1)
        proc = run("ps")
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0].split() == ["SERVICE", "INSTANCE", "STATE", "HEALTH", "ADDRESS:PORT", "UPTIME"]
        starts = [lines[0].index(c) for c in ("INSTANCE", "STATE", "HEALTH", "ADDRESS:PORT", "UPTIME")]
        db = lines[1]
        assert [db[s - 2:s] for s in starts] == ["  "] * 5, lines  # every column starts where its header does
        assert re.match(r"db +t-db +running +healthy +0\.0\.0\.0:5432 +Up \d seconds?$", db), lines
        # its published port: a forwarder from where it is published to where it listens
        assert re.match(r'web +t-web +stopped +none +127\.0\.0\.1:18089->127\.0\.0\.1:8080 +-$', lines[2]), lines
        rows = {r["service"]: r for r in json.loads(run("ps", "--format", "json").stdout)}
        assert rows["db"]["uptime"].startswith("Up ") and 1 <= rows["db"]["uptime_seconds"] < 60
        assert rows["db"]["health"] == "healthy" and rows["db"]["ports"] == [5432]
        assert rows["web"] == {"service": "web", "instance": "t-web", "state": "stopped", "exit_code": None,
                                "health": "none", "ports": [8080], "endpoints": ["0.0.0.0:8080"],
                                "published": ["127.0.0.1:18089->127.0.0.1:8080"], "not_listening": [],
                                "warnings": [], "uptime": "", "uptime_seconds": None,
                                "networks": ["default"]}
    finally:
        os.killpg(starter.pid, 9)


def test_down_signals_the_service_then_ends_the_whole_instance_tree(project):
    tmp_path, run, listing = project
    starter, init = instance_tree(tmp_path, "t-db")
    other = subprocess.Popen(["sleep", "300"])  # listed as an instance, but its parent is no starter
    try:
        everything = tree(starter.pid)
        assert len(everything) == 5
        listing.write_text(json.dumps({"instances": [{"instance": "t-db", "pid": init, "img": "x"},
                                                     {"instance": "t-web", "pid": other.pid, "img": "x"}]}))
        proc = run("down")
        assert proc.returncode == 0, proc.stderr
        assert "db: stopping t-db" in proc.stderr
        assert [p for p in everything if alive(p)] == []  # nothing left when `down` returns
        calls = [c.split("\0")[:-1] for c in (tmp_path / "record").read_text().split("\036") if c]
        stops = [c for c in calls if c[:2] == ["instance", "stop"]]
        # the tree was ended here; the process that is no instance's init was left to the runtime
        assert stops == [["instance", "stop", "-t", "0", "--", "t-web"]], stops
        assert ["instance", "list"] in calls  # it deletes the records of the instances ended here
    finally:
        other.kill()
        starter.wait(timeout=10)


@pytest.mark.parametrize("seconds,words", [
    (0, "Less than a second"), (1, "1 second"), (59, "59 seconds"), (60, "About a minute"),
    (119, "About a minute"), (120, "2 minutes"), (3599, "59 minutes"), (5399, "About an hour"),
    (5400, "2 hours"), (47 * 3600, "47 hours"), (48 * 3600 - 1800, "2 days"), (14 * 86400, "2 weeks"),
    (60 * 86400, "2 months"), (730 * 86400, "2 years")])
def test_uptime_in_docker_words(seconds, words):
    """As Docker's go-units HumanDuration words a container's uptime ("Up 3 minutes")."""
    script = f'source {REPO}/run/lib/listing.sh; human_duration {seconds}; printf %s "$DURATION"'
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.stdout == words

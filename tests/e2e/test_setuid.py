"""The setuid test bed (issue 19): Apptainer 1.4.5 installed setuid, on a node where the user
cannot make user namespaces (the seed's kind of cluster; see provision.sh and enter.sh). What a
user can and cannot do there by hand, and what doctor says of it; doctor on the rootless node too."""
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest


pytestmark = pytest.mark.e2e
STARTSCRIPT = "#!/bin/sh\n# the start script, bound in at instance start\necho started >/tmp/c2s-setuid-started\nexec sleep 300\n"


def test_the_runtime_is_setuid_and_user_namespaces_are_off(setuid_node):
    proc = setuid_node.run("apptainer buildcfg APPTAINER_SUID_INSTALL; cat /proc/sys/user/max_user_namespaces; "
                           "unshare --user true; echo unshare=$?", check=True)
    assert proc.stdout.split() == ["1", "0", "unshare=1"], proc.stdout + proc.stderr
    assert "Operation not permitted" in proc.stderr


def test_registry_images_build_and_definition_files_need_fakeroot(setuid_node):
    reg = setuid_node.registry
    proc = setuid_node.run(f"cd /tmp && apptainer build x.sif docker://{reg}/c2s/nginx:test && "
                           "apptainer inspect --runscript x.sif | head -2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OCI_ENTRYPOINT='\"/docker-entrypoint.sh\"'" in proc.stdout
    definition = f"Bootstrap: docker\nFrom: {reg}/c2s/nginx:test\n"
    proc = setuid_node.run(f"cd /tmp && printf %s '{definition}' > y.def && apptainer build y.sif y.def", timeout=600)
    assert proc.returncode != 0
    assert "/etc/subuid mapping found but no user namespace available for fakeroot" in proc.stderr, proc.stderr[-2000:]


def test_an_instance_runs_a_start_script_bound_in_at_start(setuid_node):
    reg = setuid_node.registry
    script = setuid_node.home / "startscript"
    script.write_text(STARTSCRIPT)
    script.chmod(0o755)
    os.chown(script, int(setuid_node.uid), int(setuid_node.uid))
    proc = setuid_node.run(
        f"cd ~ && apptainer build -F web.sif docker://{reg}/c2s/nginx:test >/dev/null 2>&1 && "
        "apptainer instance start --bind ~/startscript:/.singularity.d/startscript:ro web.sif c2s-setuid-web && "
        "sleep 1 && apptainer exec instance://c2s-setuid-web cat /tmp/c2s-setuid-started; "
        "apptainer instance stop c2s-setuid-web", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "started" in proc.stdout, proc.stdout + proc.stderr


def test_a_directory_overlay_is_mounted_for_the_user(setuid_node):
    """Apptainer installed setuid takes a user's directory as --overlay (kernel overlayfs): the claim
    that setuid installs refuse it holds for SingularityCE only (docs/writable-paths.md). The
    service runs as the user there, so the image's root-owned directories stay unwritable."""
    reg = setuid_node.registry
    proc = setuid_node.run(
        f"cd ~ && rm -rf ov && mkdir ov && apptainer build -F ov.sif docker://{reg}/c2s/nginx:test >/dev/null 2>&1 && "
        "apptainer exec --overlay ov ov.sif sh -c 'grep \" / \" /proc/mounts; echo x >/var/x' ; ls ov", timeout=600)
    assert re.search(r"^overlay / overlay .*upperdir=", proc.stdout, re.M), proc.stdout + proc.stderr
    assert proc.stdout.split()[-2:] == ["upper", "work"], proc.stdout
    assert "cannot create /var/x: Permission denied" in proc.stderr


def test_doctor_says_setuid_and_what_cannot_be_built(setuid_node):
    proc = setuid_node.c2s("doctor", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("ok   mode: setuid (APPTAINER_SUID_INSTALL=1") for line in lines), proc.stdout
    assert any(line.startswith("warn definition files (Dockerfile builds, curated definitions) cannot be built here")
               for line in lines), proc.stdout
    assert not any("squashfuse" in line or "fuse-overlayfs" in line for line in lines), proc.stdout
    assert "ok   writable root: a directory overlay on disk, mounted by the setuid starter" in proc.stdout


def test_doctor_on_the_rootless_node_says_unprivileged(node):
    proc = node.c2s("doctor", timeout=300)
    assert "ok   mode: unprivileged (`apptainer buildcfg` says APPTAINER_SUID_INSTALL=0)" in proc.stdout, proc.stdout
    assert "ok   definition files build here with fakeroot (hpc has a range in /etc/subuid)" in proc.stdout


def test_images_that_cannot_be_built_are_refused_before_anything_starts_and_a_dropped_sif_is_used(node, setuid_node):
    """A Dockerfile image has a definition file, which needs fakeroot here: `up` says so in one line
    before anything starts; the SIF built on the rootless node, copied to the path that line
    names, is used as given, and the service runs."""
    reg = setuid_node.registry
    setuid_node.copy_stack("build-stack", source="build-stack")
    setuid_node.run("cd ~ && rm -rf setuid-build-out")
    proc = setuid_node.c2s(f"-f build-stack/compose.yaml up -d --registry-mirror {reg} -o setuid-build-out",
                           timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = re.search(r"^run\.sh: image (\S+) cannot be built here: its definition needs fakeroot \(setuid apptainer, "
                      r"no user namespaces\); build it where user namespaces or root exist \(run\.sh build there\) and "
                      r"copy it to (\S+)\.sif, or use --remote where the site has a build service$", proc.stderr, re.M)
    assert found, proc.stderr
    assert "FATAL" not in proc.stderr  # nothing was tried
    listed = setuid_node.run("apptainer instance list", check=True).stdout
    assert "hello" not in listed, listed
    # built where user namespaces exist (the rootless node), copied where the line says
    node.copy_stack("build-stack", source="build-stack")
    proc = node.c2s(f"-f build-stack/compose.yaml convert --registry-mirror {reg} -o rootless-build-out && "
                    "rootless-build-out/run.sh build", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    built = node.home / "rootless-build-out" / "sif" / f"{found.group(1)}.sif"
    if built.is_symlink():
        built = node.root / os.readlink(built).lstrip("/")
    dropped = Path(str(setuid_node.root) + found.group(2) + ".sif")
    shutil.copyfile(built, dropped)
    os.chown(dropped, int(setuid_node.uid), int(setuid_node.uid))
    proc = setuid_node.run("cd ~ && setuid-build-out/run.sh build", timeout=300)
    assert proc.returncode == 0 and "used as given" in proc.stderr, proc.stderr
    try:
        proc = setuid_node.run("cd ~ && setuid-build-out/run.sh up -d", timeout=300)
        assert proc.returncode == 0, proc.stderr
        for _ in range(50):
            logs = setuid_node.run("cd ~ && setuid-build-out/run.sh logs hello", check=True)
            if "hi built /opt/app" in logs.stdout:
                break
            time.sleep(0.2)
        assert "hi built /opt/app" in logs.stdout, logs.stdout + logs.stderr
    finally:
        assert setuid_node.run("cd ~ && setuid-build-out/run.sh down", timeout=300).returncode == 0

PLAIN_OUT = "setuid-plain-out"
KEEP_DB = "services:\n  db:\n    volumes:\n      - pgdata:/var/lib/postgresql/data\nvolumes:\n  pgdata: {}\n"


def _get(node, path, method="GET", body=None):
    data = f"-H 'Content-Type: application/json' -d {json.dumps(json.dumps(body))}" if body is not None else ""
    proc = node.run(f"curl -fsS -X {method} {data} http://127.0.0.1:18090{path}", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _post_note(node, text):
    created = _get(node, "/api/notes", "POST", {"text": text})
    for _ in range(100):
        notes = _get(node, "/api/notes")["notes"]
        if notes and notes[-1]["id"] == created["id"] and notes[-1]["result"]:
            return notes
        time.sleep(0.2)
    raise AssertionError(f"the worker never answered note {created}: {notes}")


def _leftovers(node, out):
    """What a stack left behind on the node: instances, processes of the user, mounts and loop
    devices that name the output directory (looked up as root, in every process's mount table)."""
    listed = json.loads(node.run("apptainer instance list --json", check=True).stdout).get("instances", [])
    ps = node.run("ps -u hpc -o pid=,ppid=,stat=,comm=,args=", check=True).stdout.splitlines()
    # a zombie handed to the machine's init holds nothing and is init's to reap (this machine's
    # init reaps late); a zombie with any other parent is counted, and so is that parent
    stray = [line for line in ps if line.split()[3] not in ("ps", "bash", "su", "sh")
             and not (line.split()[2].startswith("Z") and line.split()[1] == "1")]
    path = str(node.home / out)
    mounts = set()
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        try:
            mounts.update(line for line in mountinfo.read_text().splitlines() if f"/home/hpc/{out}" in line)
        except OSError:
            pass  # the process ended meanwhile
    loops = [f.read_text().strip() for f in Path("/sys/block").glob("loop*/loop/backing_file")
             if f"/home/hpc/{out}" in f.read_text() or path in f.read_text()]
    return {"instances": listed, "processes": stray, "mounts": sorted(mounts), "loop devices": loops}


@pytest.fixture(scope="module")
def setuid_plain(setuid_node):
    node = setuid_node
    node.kill_all()  # what the tests before left running: _leftovers counts every process of the user
    node.copy_stack("plain-stack", source="plain-stack")
    (node.home / "plain-stack" / "keep-db.yaml").write_text(KEEP_DB)
    node.run(f"cd ~ && rm -rf {PLAIN_OUT}")  # no SIF anywhere: its storage is the output directory here
    yield node
    node.run(f"cd ~ && {PLAIN_OUT}/run.sh down -v", timeout=300)


def test_a_stack_of_registry_images_runs_from_no_sifs_and_leaves_nothing(setuid_plain):
    """From no SIFs on the setuid node: every image is built from docker://REF, the stack comes up
    healthy, requests flow through nginx, the api, PostgreSQL (initdb into the image's own
    root-owned /var/lib/postgresql: no volume) and Redis; ps, logs, exec and restart work; down
    leaves no instance, process, mount or loop device."""
    node = setuid_plain
    started = time.monotonic()
    proc = node.c2s(f"-f plain-stack/compose.yaml up -d --registry-mirror {node.registry} -o {PLAIN_OUT}",
                    timeout=1500)
    print(f"\nsetuid: up from no SIFs took {time.monotonic() - started:.0f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cannot be built here" not in proc.stderr and "FATAL" not in proc.stderr, proc.stderr
    state = {s["service"]: s for s in json.loads(node.run(f"cd ~ && {PLAIN_OUT}/run.sh ps --format json",
                                                          check=True).stdout)}
    for name in ("db", "cache", "api", "worker", "proxy"):
        assert state[name]["state"] == "running", state[name]
    for name in ("db", "api", "worker"):
        assert state[name]["health"] == "healthy", state[name]
    assert state["init"]["state"] == "exited" and state["init"]["exit_code"] == 0
    assert _post_note(node, "setuid")[-1]["result"] == "SETUID"
    # the database wrote its files into the image's directory, through the service's overlay
    proc = node.run(f"cd ~ && {PLAIN_OUT}/run.sh exec db sh -c 'ls $PGDATA; id -u'", check=True)
    assert "PG_VERSION" in proc.stdout.split() and proc.stdout.split()[-1] == node.uid, proc.stdout
    logs = node.run(f"cd ~ && {PLAIN_OUT}/run.sh logs db", check=True)
    assert "database system is ready to accept connections" in logs.stdout + logs.stderr
    proc = node.run(f"cd ~ && {PLAIN_OUT}/run.sh restart worker", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _post_note(node, "again")[-1]["result"] == "AGAIN"
    proc = node.run(f"cd ~ && {PLAIN_OUT}/run.sh down", timeout=300)
    assert proc.returncode == 0, proc.stderr
    left = _leftovers(node, PLAIN_OUT)
    assert not any(left.values()), left


def test_data_in_a_volume_survives_down_and_up(setuid_plain):
    node = setuid_plain
    up = (f"-f plain-stack/compose.yaml -f plain-stack/keep-db.yaml up -d --registry-mirror {node.registry} "
          f"-o {PLAIN_OUT}")
    proc = node.c2s(up, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "image c2s-postgres-test: built" not in proc.stderr  # the SIFs of the first test
    _post_note(node, "kept")
    assert node.run(f"cd ~ && {PLAIN_OUT}/run.sh down", timeout=300).returncode == 0
    proc = node.c2s(up, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [n["text"] for n in _get(node, "/api/notes")["notes"]] == ["kept"]
    assert node.run(f"cd ~ && {PLAIN_OUT}/run.sh down -v", timeout=300).returncode == 0
    left = _leftovers(node, PLAIN_OUT)
    assert not any(left.values()), left

"""What an unprivileged user can do of what dify-sandbox does for each Code node (chroot, then
setgroups/setgid/setuid to a sandbox id), under each way Apptainer can start it, on the real
rootless Apptainer of the test bed. The program run is a stand-in for dify-sandbox's runner
(sandbox-standin/code_runner.py: Dify's images cannot be pulled here). Findings:
docs/dify-sandbox.md."""
from contextlib import contextmanager

import pytest

pytestmark = pytest.mark.e2e

SIF = "~/sandbox-standin.sif"
RUNNER = "/work/tests/e2e/sandbox-standin/code_runner.py"
POOL_UID, GID, FIXED_UID = 10000, 1000, 65537  # 0.2.13+: per-run uids 10000-10999; <= 0.2.12: 65537


@contextmanager
def subid_range(node, count):
    """hpc's /etc/subuid and /etc/subgid on the node: COUNT ids from 100000, or no entry (None)."""
    files = [node.root / "etc" / name for name in ("subuid", "subgid")]
    saved = [f.read_text() for f in files]
    try:
        for f, text in zip(files, saved):
            kept = [line for line in text.splitlines() if not line.startswith("hpc:")]
            f.write_text("\n".join(kept + ([f"hpc:100000:{count}"] if count else [])) + "\n")
        yield
    finally:
        for f, text in zip(files, saved):
            f.write_text(text)


def run_code(node, flags, uid):
    node.run(f"test -s {SIF} || apptainer build {SIF} docker://{node.registry}/c2s/python:test", check=True,
             timeout=600)
    proc = node.run(f"d=$(mktemp -d) && apptainer exec {flags} {SIF} python3 {RUNNER} $d {uid} {GID}", timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("flags", ["", "--userns"])
def test_without_fakeroot_chroot_is_refused(node, flags):
    rc, out = run_code(node, flags, POOL_UID)
    print(out)
    assert rc == 1 and "chroot EPERM" in out, out


@pytest.mark.parametrize("count,uid,works", [
    (65536, POOL_UID, True),     # the usual default range: 0.2.13+ (uids 10000-10999) runs
    (65536, FIXED_UID, False),   # ... but not <= 0.2.12's fixed uid 65537
    (65537, FIXED_UID, True),    # one more id covers it
])
def test_fakeroot_with_a_subid_range(node, count, uid, works):
    with subid_range(node, count):
        rc, out = run_code(node, "--fakeroot", uid)
    print(out)
    assert "chroot ok" in out, out
    assert (rc == 0 and f"code ran as {uid}:{GID}" in out) == works, out


def test_fakeroot_without_subid_entry_maps_one_id(node):
    with subid_range(node, None):
        rc, out = run_code(node, "--fakeroot", POOL_UID)
    print(out)
    assert "chroot ok" in out and rc == 1, out  # root-mapped namespace: chroot, but no other id


@pytest.mark.parametrize("count,fakeroot", [(65536, True), (None, False)])
def test_up_gives_the_sandbox_fakeroot_only_where_its_ids_map(node, count, fakeroot):
    """`up` probes --fakeroot for the Dify sandbox adapter's service (here the stand-in runner in the
    test image tagged as dify-sandbox:0.2.15): with hpc's default subid range it gets it and Code
    runs; with no range it starts without, says once that Code nodes will not work, and runs."""
    import subprocess
    subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{node.registry}/c2s/python:test", f"docker://{node.registry}/c2s/dify-sandbox:0.2.15"],
                   check=True, capture_output=True)
    node.copy_stack("sandbox-standin", source="sandbox-standin")
    out = "out-sandbox"
    try:
        with subid_range(node, count):
            proc = node.c2s(f"-f sandbox-standin/compose.yaml up -d --registry-mirror {node.registry} -o {out}",
                            timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said = [line for line in proc.stderr.splitlines() if "Code nodes will not work" in line]
        assert len(said) == (0 if fakeroot else 1), proc.stderr
        logs = ""
        for _ in range(50):
            logs = node.run(f"cd ~ && {out}/run.sh logs sandbox", timeout=60).stdout
            if "code ran" in logs or "EPERM" in logs:
                break
            node.run("sleep 0.2")
        assert ("code ran as 10000:1000" in logs) == fakeroot and ("chroot EPERM" in logs) != fakeroot, logs
        assert "running" in node.run(f"cd ~ && {out}/run.sh ps", timeout=60).stdout
    finally:
        node.run(f"cd ~ && {out}/run.sh down", timeout=120)

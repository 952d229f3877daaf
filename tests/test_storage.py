"""Where run.sh keeps SIFs and build caches (off $HOME), `build --pull`/`pull`, build progress and
what `compose2sif doctor` says of storage. The runtime here is a BUILDING STAND-IN for apptainer
(written by the test below): it answers --version, and `build` writes a small file where the SIF
goes and records the APPTAINER_* variables it was given. The test bed does the same with the real
Apptainer (tests/e2e/test_builds.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COMPOSE = "services:\n  kv:\n    image: 127.0.0.1:1/c2s/kv:test\n  app:\n    build: .\n"
STANDIN = """#!/bin/bash
# BUILDING STAND-IN for apptainer (tests only)
case "$1" in
    --version) echo "apptainer version 1.4.5" ;;
    build) shift; [ "$1" = --force ] && shift; [ "$1" = --fakeroot ] && shift
        env | grep '^APPTAINER_' | sort >>"$C2S_ENV_RECORD"; echo "built $2" >"$1"
        [ -z "${STANDIN_FAIL:-}" ] ;;
esac
"""


@pytest.fixture
def project(tmp_path):
    """A converted project, a home directory and the stand-in runtime."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "compose.yaml").write_text(COMPOSE)
    (tmp_path / "proj" / "Dockerfile").write_text("FROM debian:12\nRUN true\n")
    (tmp_path / "home").mkdir()
    standin = tmp_path / "bin" / "apptainer"
    standin.parent.mkdir()
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    env = {"PATH": f"{standin.parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO),
           "USER": "c2s-test-nobody", "C2S_ENV_RECORD": str(tmp_path / "env-record"), "LANG": "C.UTF-8"}
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(tmp_path / "out")],
                          cwd=tmp_path / "proj", env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tmp_path, env


def run(tmp_path, env, *args, **extra):
    return subprocess.run([str(tmp_path / "out" / "run.sh"), *args], cwd=tmp_path, env={**env, **extra},
                          capture_output=True, text=True, timeout=120)


def storage(tmp_path, env, **extra):
    proc = run(tmp_path, env, "_storage", **extra)
    assert proc.returncode == 0, proc.stderr
    return {row.split("\t")[0]: row.split("\t")[1:] for row in proc.stdout.splitlines()}


def test_without_a_scratch_dir_storage_is_the_output_dir_never_home(project):
    tmp_path, env = project
    places = storage(tmp_path, env)
    out = str(tmp_path / "out")
    assert places["storage"] == [f"{out}/cache", "no scratch or work directory found: in the output directory"]
    assert places["SIF cache"][0] == f"{out}/cache/sif" and places["build cache"][0] == f"{out}/cache/cache"
    assert (tmp_path / "out" / "state" / "storage").read_text() == f"{out}/cache\n"


def test_scratch_is_detected_outside_home_and_the_choice_is_kept(project):
    tmp_path, env = project
    scratch, work = tmp_path / "scratch", tmp_path / "work"
    scratch.mkdir()
    work.mkdir()
    inside_home = tmp_path / "home" / "scratch"
    inside_home.mkdir()
    # a $SCRATCH inside the home directory is no scratch: $WORK is taken
    places = storage(tmp_path, env, SCRATCH=str(inside_home), WORK=str(work))
    assert places["storage"][0] == f"{work}/compose2sif"
    # chosen once: a $SCRATCH that appears later changes nothing, C2S_STORAGE does
    assert storage(tmp_path, env, SCRATCH=str(scratch))["storage"] == [
        f"{work}/compose2sif", f"chosen at the first build, kept in {tmp_path}/out/state/storage"]
    assert storage(tmp_path, env, C2S_STORAGE=str(scratch / "mine"))["storage"] == [str(scratch / "mine"),
                                                                                   "set by C2S_STORAGE"]
    (tmp_path / "out" / "state" / "storage").unlink()
    assert storage(tmp_path, env, SCRATCH=str(scratch))["storage"][0] == f"{scratch}/compose2sif"


def test_build_passes_the_chosen_caches_unless_the_user_set_them(project):
    tmp_path, env = project
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = run(tmp_path, env, "build", SCRATCH=str(scratch))
    assert proc.returncode == 0, proc.stderr
    assert f"storage: SIFs and build caches go to {scratch}/compose2sif" in proc.stderr
    record = (tmp_path / "env-record").read_text().splitlines()
    assert record.count(f"APPTAINER_CACHEDIR={scratch}/compose2sif/cache") == 2
    assert record.count(f"APPTAINER_TMPDIR={scratch}/compose2sif/tmp") == 2
    sifs = sorted((tmp_path / "out" / "sif").glob("*.sif"))
    assert len(sifs) == 2 and all(s.stat().st_nlink == 2 for s in sifs)  # linked to the cache, not copied
    assert not list((tmp_path / "home").rglob("*"))
    # the user's own settings are left as they are
    (tmp_path / "env-record").unlink()
    proc = run(tmp_path, env, "build", C2S_FORCE_BUILD="1", APPTAINER_CACHEDIR=str(tmp_path / "c"),
               APPTAINER_TMPDIR=str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    assert sorted(set((tmp_path / "env-record").read_text().splitlines())) == [
        f"APPTAINER_CACHEDIR={tmp_path}/c", f"APPTAINER_TMPDIR={tmp_path}/t"]


def test_a_second_project_takes_the_sif_from_the_shared_cache(project):
    tmp_path, env = project
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    assert run(tmp_path, env, "build", SCRATCH=str(scratch)).returncode == 0
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(tmp_path / "out2")],
                          cwd=tmp_path / "proj", env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    second = subprocess.run([str(tmp_path / "out2" / "run.sh"), "build"], env={**env, "SCRATCH": str(scratch)},
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert second.stderr.count(f"taken from {scratch}/compose2sif/sif") == 2, second.stderr


def test_pull_with_an_unreadable_registry_builds_again_and_says_why(project):
    tmp_path, env = project
    assert run(tmp_path, env, "build").returncode == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    pulled = [k for k, v in plan["images"].items() if v["kind"] == "docker"]
    assert f"PULLED=({pulled[0]})" in (tmp_path / "out" / "run.sh").read_text()
    proc = run(tmp_path, env, "pull")  # 127.0.0.1:1 refuses: the digest cannot be read
    assert proc.returncode == 0, proc.stderr
    assert (f"image {pulled[0]}: cannot read the digest of 127.0.0.1:1/c2s/kv:test from its registry: "
            "building it again") in proc.stderr
    assert f"image {pulled[0]}: built" in proc.stderr
    assert "image build-" not in proc.stderr  # pull leaves builds alone; build --pull does not
    proc = run(tmp_path, env, "pull", "app")
    assert proc.returncode == 0 and "pull: app is built, not pulled" in proc.stderr, proc.stderr
    assert "building" not in proc.stderr
    proc = run(tmp_path, env, "pull", "kv")
    assert f"image {pulled[0]}: built" in proc.stderr, proc.stderr
    assert run(tmp_path, env, "pull", "nope").stderr.startswith("run.sh: no such service: nope")
    proc = run(tmp_path, env, "build", "--pull")
    assert "image build-app: checking debian:12" in proc.stderr, proc.stderr
    assert run(tmp_path, env, "build", "--pul").stderr.strip() == \
        "run.sh: build: unknown argument --pul (usage: build [--pull] [--force])"


def test_build_progress_is_plain_lines_off_a_terminal_and_a_redrawn_block_on_one(project):
    tmp_path, env = project
    proc = run(tmp_path, env, "build")
    lines = [line for line in proc.stderr.splitlines() if "image " in line]
    assert len(lines) == 4 and all(line.endswith((": building", ": building --fakeroot", ": built")) for line in lines)
    assert "\033[" not in proc.stderr
    script = f"C2S_FORCE_BUILD=1 {tmp_path}/out/run.sh build"
    on_tty = subprocess.run(["script", "-qec", script, "/dev/null"], env={**env, "TERM": "xterm"},
                            capture_output=True, text=True, timeout=120)
    assert on_tty.returncode == 0, on_tty.stdout
    assert "\033[2A" in on_tty.stdout and on_tty.stdout.rstrip().endswith("built")
    dumb = subprocess.run(["script", "-qec", script, "/dev/null"], env={**env, "TERM": "dumb"},
                          capture_output=True, text=True, timeout=120)
    assert "\033[" not in dumb.stdout and ": built" in dumb.stdout


def test_failed_build_names_its_log_and_an_unwritable_cache_says_what_to_set(project):
    tmp_path, env = project
    proc = run(tmp_path, env, "build", STANDIN_FAIL="1")
    assert proc.returncode == 1
    log = tmp_path / "out" / "state" / "logs"
    assert "failed (log: " + str(log / "build-") in proc.stderr and "retrying alone" in proc.stderr
    proc = run(tmp_path, env, "build", C2S_SIF_CACHE="/proc/c2s-cannot")
    assert proc.returncode == 1
    assert "set C2S_STORAGE, or C2S_SIF_CACHE and APPTAINER_CACHEDIR, to a writable place" in proc.stderr


def test_doctor_prints_where_sifs_go_with_free_space_and_quota(project, monkeypatch):
    tmp_path, env = project
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "doctor", "-o", str(tmp_path / "out")],
                          cwd=tmp_path, env={**env, "SCRATCH": str(scratch)}, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.splitlines()
    sif = next(line for line in lines if " SIF cache: " in line)
    assert sif.startswith(f"ok   SIF cache: {scratch}/compose2sif/sif (a scratch or work directory outside $HOME), ")
    assert "GiB free, quota: unknown" in sif  # no quota tool here
    assert any(line.startswith(f"ok   build cache: {scratch}/compose2sif/cache") for line in lines)
    assert "ok   features of apptainer 1.4.5 used here: --no-eval, a writable root without setuid, " \
           "--fakeroot without /etc/subuid (Apptainer >= 1.1)" in lines


def test_quota_is_read_from_quota_and_unknown_when_it_hangs(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO))
    from compose2sif import doctor
    point, source, _ = doctor._mount(str(tmp_path))
    fake = tmp_path / "bin" / "quota"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\ncat <<EOF\nDisk quotas for user u (uid 1):\n     Filesystem   space   quota   limit"
                    f"   grace   files   quota   limit   grace\n{source}\n  1200M*  5000M  6000M  7days  12  0  0\nEOF\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    assert doctor.quota_text(str(tmp_path)) == "quota: 1200M used of 6000M (quota)"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(doctor, "QUOTA_TIMEOUT", 1)
    assert doctor.quota_text(str(tmp_path)) == "quota: unknown"


def test_doctor_warns_of_features_an_old_apptainer_lacks():
    sys.path.insert(0, str(REPO))
    from compose2sif import doctor
    lines = doctor.feature_lines("apptainer", "1.0.3", {"images": {"x": {"kind": "docker"}}})
    assert [level for level, _ in lines] == ["warn", "warn"]  # no build: fakeroot is not needed
    assert lines[0][1].startswith("apptainer 1.0.3 lacks --no-eval, which Apptainer >= 1.1 has")
    assert "a writable root without setuid" in lines[1][1]

"""`compose2sif doctor` on this machine, with the RECORDING STAND-IN for apptainer
(tests/standins/recording-standin-apptainer) as the runtime: every line is ok, warn or fail, a
taken planned endpoint is a fail naming who holds it, and a fail exits 1. The test bed runs it
with the real Apptainer (tests/e2e/test_hostile_e2e.py)."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standins" / "recording-standin-apptainer"
COMPOSE = 'services:\n  cache:\n    image: redis:7\n    ports: ["127.0.0.1:{port}:6379"]\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _doctor(tmp_path, out):
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "C2S_RUNTIME": str(STANDIN), "C2S_RECORD": str(tmp_path / "record"), "C2S_SIF_CACHE": str(tmp_path / "sif")}
    return subprocess.run([sys.executable, "-m", "compose2sif", "doctor", "-o", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_doctor_names_a_taken_endpoint_and_fails(tmp_path):
    port = _free_port()
    (tmp_path / "compose.yaml").write_text(COMPOSE.format(port=port))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(out)], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    endpoint = json.loads((out / "plan.json").read_text())["services"][0]["ports"][0]
    assert (endpoint["host"], endpoint["forward"]) == (6379, f"127.0.0.1:{port}")  # a forwarder publishes it
    free = _doctor(tmp_path, out)
    levels = [line.split()[0] for line in free.stdout.splitlines()]
    assert levels and set(levels) <= {"ok", "warn", "fail"}, free.stdout
    assert f"ok   service cache: published 127.0.0.1:{port} is free" in free.stdout
    assert "runtime: " in free.stdout and "SIF cache: " in free.stdout
    assert free.returncode == (1 if "fail" in levels else 0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        taken = _doctor(tmp_path, out)
    assert taken.returncode == 1
    line = next(line for line in taken.stdout.splitlines() if f":{port}" in line)
    assert line.startswith(f"fail service cache: published 127.0.0.1:{port} is taken (held by python"), line
    assert f"pid {os.getpid()}" in line


def test_a_listener_inside_an_instance_is_found_by_its_ancestry():
    """doctor's "served by its own running instance": the holder ss names, and the instance whose
    init is among its ancestors (this test process stands in for an instance's init)."""
    from compose2sif.doctor import _holder, _instance_of
    port = _free_port()
    child = subprocess.Popen([sys.executable, "-c", "import socket, sys, time; s = socket.socket(); "
                              f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        text, pid = _holder(("127.0.0.1", port))
        assert pid == child.pid and text.startswith("held by python"), text
        assert _instance_of(pid, {os.getpid(): "c2s-p-cache"}) == "c2s-p-cache"
        assert _instance_of(pid, {12345678: "c2s-p-other"}) is None
        assert _holder(("127.0.0.2", port)) == ("held by another user's process, or one ss cannot name", None)
    finally:
        child.kill()
        child.wait()


BUILDCFG = """#!/bin/sh
# STAND-IN for `apptainer buildcfg` / `singularity buildcfg`: prints the keys doctor reads
[ "$1" = buildcfg ] && printf '%s\\n' {lines}
"""


def _runtime_standin(tmp_path, prefix: str, suid: str, allow: str):
    """A stand-in runtime whose buildcfg points at a libexec and a config under tmp_path, with a
    starter-suid root-owned and setuid (these tests run as root, as the e2e ones do)."""
    flavour = prefix.lower()
    starter = tmp_path / "lib" / flavour / "bin" / "starter-suid"
    starter.parent.mkdir(parents=True)
    starter.write_text("")
    os.chown(starter, 0, 0)
    starter.chmod(0o4755)
    conf = tmp_path / "etc" / flavour / f"{flavour}.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text(f"# allow setuid = no\nallow setuid = {allow}\nsessiondir max size = 32\n")
    lines = " ".join(f"'{line}'" for line in (f"{prefix}_SUID_INSTALL={suid}", f"LIBEXECDIR={tmp_path}/lib",
                                               f"SYSCONFDIR={tmp_path}/etc"))
    binary = tmp_path / "standin-runtime"
    binary.write_text(BUILDCFG.format(lines=lines))
    binary.chmod(0o755)
    return str(binary), starter, conf


def test_the_mode_comes_from_buildcfg_the_starter_and_the_config(tmp_path):
    from compose2sif.doctor import runtime_mode
    if os.geteuid() != 0:
        import pytest
        pytest.skip("makes a root-owned setuid file: run as root")
    binary, starter, conf = _runtime_standin(tmp_path, "APPTAINER", "1", "yes")
    mode = runtime_mode(binary, uid=1000)
    assert (mode.mode, mode.flavour, mode.config_path) == ("setuid", "apptainer", str(conf))
    assert mode.config["sessiondir max size"] == "32" and str(starter) in mode.why
    assert runtime_mode(binary, uid=0).mode == "root"
    conf.write_text("allow setuid = no\n")
    assert runtime_mode(binary, uid=1000).mode == "unprivileged"
    assert "allow setuid = no" in runtime_mode(binary, uid=1000).why
    conf.write_text("allow setuid = yes\n")
    starter.chmod(0o755)
    assert runtime_mode(binary, uid=1000).mode == "unprivileged"


def test_singularity_spellings_and_a_non_suid_build(tmp_path):
    from compose2sif.doctor import runtime_mode
    if os.geteuid() != 0:
        import pytest
        pytest.skip("makes a root-owned setuid file: run as root")
    binary, _, conf = _runtime_standin(tmp_path, "SINGULARITY", "1", "yes")
    mode = runtime_mode(binary, uid=1000)
    assert (mode.mode, mode.flavour, mode.config_path) == ("setuid", "singularity", str(conf))
    binary, _, _ = _runtime_standin(tmp_path / "b", "APPTAINER", "0", "yes")
    mode = runtime_mode(binary, uid=1000)
    assert mode.mode == "unprivileged" and "APPTAINER_SUID_INSTALL=0" in mode.why


def test_each_service_only_a_loopback_of_its_own_runs_is_a_fail_line_where_there_is_none(tmp_path):
    from compose2sif.doctor import untraceable_lines
    (tmp_path / "plan.json").write_text(json.dumps({"services": [
        {"name": "low", "image": "py", "needs_loopback": "service 'low' listens on port 80 (seen in: ports) ...; fix: X"},
        {"name": "db", "image": "py", "needs_loopback": ""}]}))
    assert untraceable_lines(str(tmp_path)) == []  # no image built: `up` would not get that far
    (tmp_path / "sif").mkdir()
    (tmp_path / "sif" / "py.sif").write_text("")
    assert untraceable_lines(str(tmp_path)) == [
        ("fail", "service low: `up` refuses it on this node: service 'low' listens on port 80 (seen in: ports) ...; fix: X")]


def test_doctor_names_each_helpers_version_and_origin_and_what_a_missing_one_costs(project, monkeypatch):
    """doctor's lines on the helpers of bin/ARCH/: each that runs here, with its version and where
    it came from; where the node's architecture has no forwarder, the Python fallback, or, with
    no python3 either, each service whose published ports fail."""
    from compose2sif import doctor
    tmp_path, _, _ = project
    out = tmp_path / "out"
    listing = json.loads((out / "bin" / "helpers.json").read_text())
    version = {h["name"]: h["version"] for h in listing["helpers"] if h["arch"] == "x86_64"}
    origin = f"built with {listing['toolchain']} by the compose2sif 0.1.0 package build"
    monkeypatch.setattr(doctor, "node_architecture", lambda: "x86_64")
    lines = doctor.helper_lines(str(out))
    assert [level for level, _ in lines] == ["ok", "ok"]
    assert lines[0][1].startswith(f"helper c2s-forward {version['c2s-forward']} (x86_64): {origin}, sha256 ")
    assert lines[1][1].startswith(f"helper c2s-loopback {version['c2s-loopback']} (x86_64): {origin}, sha256 ")
    # an aarch64 node reads the same output: its forwarder, no tracer (isolation_line says so)
    monkeypatch.setattr(doctor, "node_architecture", lambda: "ppc64le")
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/python3" if name == "python3" else None)
    assert doctor.helper_lines(str(out)) == [
        ("warn", "published ports: compose2sif's package has no c2s-forward for this node's architecture, ppc64le "
                 "(only for aarch64, x86_64); the node's /usr/bin/python3 serves them (bin/c2s-forward.py)")]
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    assert doctor.helper_lines(str(out)) == [
        ("fail", "service web: `up` will fail it: its published ports need a forwarder: compose2sif's package has no "
                 "c2s-forward for this node's architecture, ppc64le (only for aarch64, x86_64), and the node has no "
                 "python3 to run bin/c2s-forward.py instead")]
    # a helper that does not run here is a fail naming it
    monkeypatch.setattr(doctor, "node_architecture", lambda: "x86_64")
    (out / "bin" / "x86_64" / "c2s-forward").write_bytes(b"\x7fELF" + bytes(60))  # a truncated binary
    assert doctor.helper_lines(str(out))[0][0] == "fail"
    assert doctor.helper_lines(str(out))[0][1].startswith("helper c2s-forward (x86_64, bin/x86_64/c2s-forward) does not "
                                                          "run here: ")

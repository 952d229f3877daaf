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
    assert (endpoint["address"], endpoint["host"]) == ("127.0.0.1", port)
    free = _doctor(tmp_path, out)
    levels = [line.split()[0] for line in free.stdout.splitlines()]
    assert levels and set(levels) <= {"ok", "warn", "fail"}, free.stdout
    assert f"ok   service cache: 127.0.0.1:{port} is free" in free.stdout
    assert "runtime: " in free.stdout and "SIF cache: " in free.stdout
    assert free.returncode == (1 if "fail" in levels else 0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        taken = _doctor(tmp_path, out)
    assert taken.returncode == 1
    line = next(line for line in taken.stdout.splitlines() if f":{port}" in line)
    assert line.startswith(f"fail service cache: 127.0.0.1:{port} is taken (held by python"), line
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

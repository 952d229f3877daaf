"""Issue 43 on the real test bed (rootless Apptainer, as written under the tracer): what Dify's own
stack showed at `up`, on STAND-INS that do what its programs did (tests/e2e/front-door-stack):
- `web` publishes 80 and 443 and listens on 80 only, as Dify's nginx with HTTPS off: both
  forwarders run, 443 closes its connections, 80 answers, and `up` says it in one line;
- `late` starts to listen after the listen wait (C2S_LISTEN_TIMEOUT=4), as Dify's API during its
  import: started, not failed; `ps` shows it waiting, then the supervisor sees it listen;
- `crash` (publishing a port) exits while `up` waits for it to listen: failed, with its own last line;
  `proxy`, Debian's real squid given a config it refuses, fails with the line that says why;
- `signal` is built from a Dockerfile with STOPSIGNAL SIGINT: plan.json says so and `down` sends it."""
import json
import re
import socket
import subprocess
import time

import pytest

pytestmark = pytest.mark.e2e

OUT = "front-door-out"
WEB, TLS, LATE, CRASH, PROXY = 18131, 18132, 18133, 18134, 18135
ENV = (f"WEB_PORT={WEB} TLS_PORT={TLS} LATE_PORT={LATE} CRASH_PORT={CRASH} PROXY_PORT={PROXY} LATE_AFTER=25 "
       "C2S_LISTEN_TIMEOUT=4")


def ps_json(node):
    proc = node.run(f"cd ~ && {OUT}/run.sh ps --format json", check=True)
    return {row["service"]: row for row in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def door(node):
    node.copy_stack("front-door-stack", source="front-door-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    started = time.monotonic()
    proc = node.run(f"cd ~ && {ENV} python3 -m compose2sif -f front-door-stack/compose.yaml up -d "
                    f"--registry-mirror {node.registry} -o {OUT}", timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield node, proc, started
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def test_a_published_port_nobody_binds_is_served_as_docker_serves_it(door):
    node, proc, _ = door
    lines = [line for line in proc.stderr.splitlines() if "not listening yet" in line and "web:" in line]
    assert lines == [lines[0]] and re.search(r"web: started, not listening yet on 443 \(waited \d+ s; it is "
                                             r"watched, and C2S_LISTEN_TIMEOUT=SECONDS waits longer\)", lines[0]), proc.stderr
    assert "failed" not in proc.stderr, proc.stderr
    got = node.run(f"curl -fsS http://127.0.0.1:{WEB}/", timeout=60)
    assert got.returncode == 0 and json.loads(got.stdout) == {"service": "web"}, got.stderr
    with socket.create_connection(("127.0.0.1", TLS), timeout=10) as tls:  # its forwarder: closed, no answer
        tls.settimeout(10)
        try:
            assert tls.recv(1) == b""
        except ConnectionResetError:
            pass
    web = ps_json(node)["web"]
    assert web["state"] == "running" and web["not_listening"] == [443]
    assert any(p.endswith(f":{TLS}->" + p.split("->")[1]) for p in web["published"])
    table = node.run(f"cd ~ && {OUT}/run.sh ps", check=True).stdout
    assert "WAIT service web: started, not listening yet on 443" in table


def test_a_service_that_listens_late_is_started_and_watched_until_it_listens(door):
    node, proc, started = door
    assert re.search(r"late: started, not listening yet on 8000 \(waited [45] s", proc.stderr), proc.stderr
    assert ps_json(node)["late"]["not_listening"] in ([8000], [])  # (it may listen by now)
    deadline = started + 240
    while time.monotonic() < deadline and ps_json(node)["late"]["not_listening"]:
        time.sleep(2)
    assert ps_json(node)["late"]["not_listening"] == []
    got = node.run(f"curl -fsS http://127.0.0.1:{LATE}/", timeout=60)
    assert got.returncode == 0 and json.loads(got.stdout) == {"service": "late"}, got.stderr
    for _ in range(30):  # the supervisor's line (it looks once a second)
        log = (node.home / OUT / "state" / "logs" / "supervisor.log").read_text()
        if "late: listening on 8000 now" in log:
            break
        time.sleep(1)
    assert re.search(r"late: listening on 8000 now, \d+ s after its start", log), log
    table = node.run(f"cd ~ && {OUT}/run.sh ps", check=True).stdout
    assert "WAIT service late" not in table


def test_a_service_that_exits_at_once_fails_with_its_own_words(door):
    node, _, _ = door
    node.run("cd ~ && rm -rf front-door-crash")
    proc = node.run(f"cd ~ && {ENV} python3 -m compose2sif -f front-door-stack/compose.yaml -p c2s-front-door-crash "
                    f"--profile crash up -d crash proxy --registry-mirror {node.registry} -o front-door-crash", timeout=900)
    node.run("cd ~ && front-door-crash/run.sh down", timeout=300)
    assert proc.returncode != 0
    assert "service crash failed" in proc.stderr and "crash: the configuration names no database" in proc.stderr, \
        proc.stderr
    # squid says why on no output of its own: the line that names the bad setting is shown all the same
    assert "service proxy failed" in proc.stderr and "c2s-not-a-port" in proc.stderr, proc.stderr


def test_the_images_stopsignal_is_what_down_sends(door):
    node, _, _ = door
    plan = {s["name"]: s for s in json.loads((node.home / OUT / "plan.json").read_text())["services"]}
    assert (plan["signal"]["stop_signal"], plan["signal"]["stop_signal_from"]) == ("SIGINT", "Dockerfile STOPSIGNAL")
    assert plan["web"]["stop_signal_from"].startswith(("image config", "default"))
    proc = node.run(f"cd ~ && {OUT}/run.sh down", timeout=300)
    assert proc.returncode == 0, proc.stderr
    volume = node.home / OUT / "state" / "volumes" / "signals"
    assert (volume / "got").read_text() == "SIGINT\n"

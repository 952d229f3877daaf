"""Dify's front on the real test bed, with Dify's own .env (tests/fixtures/dify/env.example copied
to .env, as Dify's users do): nginx and the SSRF proxy with the configs compose2sif renders from
Dify 1.17.1's own templates, PostgreSQL and Redis started with generated secrets, as an
unprivileged user on a rootless Apptainer. Debian's real nginx, squid, PostgreSQL and Redis stand
for the images Dify names. Dify's own services cannot be pulled here: api, web and plugin_daemon
are STAND-INS that answer with the name of the service they stand in for, and agent_backend (Dify's
own definition) runs an agent-server STAND-IN that refuses to start, as Dify's does, unless
DIFY_AGENT_SERVER_SECRET_KEY is unpadded base64url of exactly 32 bytes (tests/e2e/dify-front)."""
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
DIFY = TESTS.parent.parent / "shared" / "reference" / "dify-1.17.1"
DIFY_ENV = (TESTS / "fixtures" / "dify" / "env.example").read_text()
SQUID_TEMPLATE_STANDIN = (TESTS / "standins" / "dify-squid.conf.template").read_text()

pytestmark = pytest.mark.e2e

OUT = "out-dify"
FRONT, FRONT_TLS = 18095, 18096
ALLOWED, DENIED = "127.77.0.1", "127.77.0.2"   # two private hosts: one on the SSRF allow-list


@pytest.fixture(scope="module")
def front(node):
    stack = node.copy_stack("dify-front", source="dify-front")
    shutil.copytree(DIFY, stack / "dify")
    (stack / "dify" / "ssrf_proxy" / "squid.conf.template").write_text(SQUID_TEMPLATE_STANDIN)
    for dotenv in (stack / ".env", stack / "dify" / ".env"):  # the project's, and Dify's env_file
        dotenv.write_text(DIFY_ENV)
    # the agent-server stand-in runs in the test image under the name of Dify's, so the Dify adapter shapes it
    subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{node.registry}/c2s/python:test",
                    f"docker://{node.registry}/c2s/dify-agent-backend:1.17.1"], check=True, capture_output=True)
    subprocess.run(["chmod", "-R", "u+w", str(stack)], check=True)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(stack)], check=True)
    node.run(f"cd ~ && rm -rf {OUT}")
    for host in (ALLOWED, DENIED):  # plain HTTP servers on two private addresses, as the test's own
        # (the subshell's own output closed too: node.run waits until nothing holds its pipes)
        node.run(f"cd /tmp && (setsid python3 -m http.server --bind {host} 18999 &) </dev/null >/dev/null 2>&1")
    try:
        proc = node.c2s(f"-f dify-front/compose.yaml up -d --preset dify --ssrf-allow {ALLOWED}/32 "
                        f"--registry-mirror {node.registry} -o {OUT}", timeout=1500)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield node, proc
    finally:  # also after a failed up: nothing of it may stay for the next tests
        node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)
        node.run("pkill -f 'http.server --bind 127.77.0'")


def plan(node):
    return {s["name"]: s for s in json.loads((node.home / OUT / "plan.json").read_text())["services"]}


def test_up_prints_the_way_in(front):
    _, proc = front
    assert f":{FRONT}/install" in proc.stderr and "ssh -N -L" in proc.stderr


def test_https_published_with_https_off_is_served_as_docker_serves_it(front):
    """Dify's default .env publishes 443 with HTTPS off: nginx never listens there. Its forwarders
    run all the same (a connection is closed), `up` says so once, and 80 answers (the tests below)."""
    node, proc = front
    said = [line for line in proc.stderr.splitlines() if "not listening yet" in line]
    assert len(said) == 1 and "nginx: started, not listening yet on 443" in said[0], proc.stderr
    closed = node.run(f"curl -sS -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{FRONT_TLS}/", timeout=60)
    assert closed.returncode != 0 and closed.stdout == "000", closed.stdout + closed.stderr


def test_nginx_logs_each_request_through_its_images_links_to_stdout(front):
    """The image links /var/log/nginx/access.log to /dev/stdout, as the official one does; the
    scratch directory bound there keeps the link, so `logs nginx` shows the requests."""
    node, _ = front
    assert node.run(f"curl -fsS -o /dev/null http://127.0.0.1:{FRONT}/console/api/setup?c2s-log-probe=1",
                    timeout=60).returncode == 0
    for _ in range(50):
        logs = node.run(f"cd ~ && {OUT}/run.sh logs nginx").stdout
        if "c2s-log-probe=1" in logs:
            break
        time.sleep(0.2)
    assert "GET /console/api/setup?c2s-log-probe=1" in logs, logs[-2000:]


def test_rendered_nginx_config_is_valid_and_each_location_reaches_its_upstream(front):
    node, _ = front
    # (nginx -t opens its logs, links to /dev/stdout and /dev/stderr as in the official image: the test
    # bed's pipes belong to root, which the node's user may not open again; a file of the user's is both)
    check = node.run(f"cd ~ && {OUT}/run.sh exec nginx sh -c 'nginx -t >/tmp/nginx-t.log 2>&1; rc=$?; "
                     "cat /tmp/nginx-t.log >&2; exit $rc'")
    assert check.returncode == 0, check.stderr
    for path, upstream in (("/console/api/setup", "api"), ("/api/x", "api"), ("/v1/chat", "api"),
                           ("/files/f", "api"), ("/explore/apps", "web"), ("/e/hook", "plugin_daemon"),
                           ("/socket.io/?EIO=4", "api"), ("/", "web"), ("/mcp", "api"), ("/triggers/t", "api")):
        proc = node.run(f"curl -fsS http://127.0.0.1:{FRONT}{path}", timeout=60)
        assert proc.returncode == 0, (path, proc.stderr)
        assert json.loads(proc.stdout)["service"] == upstream, path


def test_ssrf_proxy_parses_and_forwards_only_to_allowed_private_hosts(front):
    node, _ = front
    proxy = next(p for p in plan(node)["ssrf_proxy"]["ports"] if p["container"] == 3128)
    assert proxy["address"] != "0.0.0.0"
    parse = node.run(f"cd ~ && {OUT}/run.sh exec ssrf_proxy squid -k parse -f /etc/squid/squid.conf")
    assert parse.returncode == 0, parse.stderr
    via = f"-x http://{proxy['address']}:{proxy['host']}"
    allowed = node.run(f"curl -s -o /dev/null -w '%{{http_code}}' {via} http://{ALLOWED}:18999/", timeout=60)
    denied = node.run(f"curl -s -o /dev/null -w '%{{http_code}}' {via} http://{DENIED}:18999/", timeout=60)
    assert (allowed.stdout, denied.stdout) == ("200", "403")


def test_postgres_and_redis_run_with_generated_secrets(front):
    node, _ = front
    secrets = dict(line.split("=", 1) for line in (node.home / OUT / "secrets.env").read_text().splitlines()
                   if "=" in line)
    assert secrets["DB_PASSWORD"] != "difyai123456" and secrets["REDIS_PASSWORD"] != "difyai123456"
    services = plan(node)
    assert services["db_postgres"]["ports"][0]["address"] == services["db_postgres"]["address"] != "0.0.0.0"
    api = services["api"]
    for check, expected in (("db", "dify"), ("redis", True)):
        proc = node.run(f"curl -fsS http://{api['address']}:5001/{check}", timeout=60)
        assert proc.returncode == 0 and json.loads(proc.stdout)[check] == expected, proc.stderr
    for process in node.processes():  # neither the public defaults nor the generated values on argv
        assert "difyai123456" not in process and secrets["REDIS_PASSWORD"] not in process, process


def test_agent_server_starts_with_the_generated_key_on_its_own_address(front):
    node, proc = front
    assert "DIFY_AGENT_SERVER_SECRET_KEY is set to a placeholder" in proc.stderr
    secrets = dict(line.split("=", 1) for line in (node.home / OUT / "secrets.env").read_text().splitlines()
                   if "=" in line)
    agent = plan(node)["agent_backend"]
    assert agent["address"] not in ("0.0.0.0", "::")
    assert agent["launch"][-4:] == ["--host", "0.0.0.0", "--port", "5050"]  # as written: its tracer moves the bind
    base = f"http://{agent['address']}:5050"
    health = node.run(f"curl -fsS {base}/health", timeout=60)
    assert health.returncode == 0 and json.loads(health.stdout)["service"] == "agent_backend", (
        health.stderr + node.run(f"cd ~ && {OUT}/run.sh logs agent_backend").stdout)
    token = secrets["DIFY_AGENT_API_TOKEN"]
    runs = node.run(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {token}' {base}/runs")
    wrong = node.run(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer x{token}' {base}/runs")
    assert (runs.stdout, wrong.stdout) == ("200", "401")
    api_env = (node.home / OUT / "env" / "api.env").read_text()
    assert f"AGENT_BACKEND_API_TOKEN={token}" in api_env
    for path in (node.home / OUT).rglob("*"):
        if path.is_file():
            assert "replace-with-base64url-32-byte-secret" not in path.read_text(errors="replace"), path

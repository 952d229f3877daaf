"""Dify 1.17.1's own docker/ directory (../shared/reference/dify-1.17.1), converted with no edits,
the way Dify's users run it: with Dify's own .env.example copied to .env (tests/fixtures/dify, see
its PROVENANCE.md), and with the one-line .env of bench/ and the examples.

One file Dify's checkout has is not in the reference copy, so the tests write a stand-in, named as
such: ssrf_proxy/squid.conf.template (1.17's was not obtained; the stand-in follows the documented
order: common settings, the private allow-list, deny private networks, allow local).

Each generated secret is checked against the rule of the code that reads it, written out here
from that code (not from compose2sif's own rules, which could share a mistake):
- DIFY_AGENT_SERVER_SECRET_KEY: langgenius/dify dify-agent/src/dify_agent/agent_stub/server/tokens/
  agent_stub.py `decode_server_secret_key` (commit 2a3d0564b6f9), called at start by
  dify-agent/src/dify_agent/server/settings.py `validate_server_secret_key` (commit 07e7c7fd28b8; it
  is required because DIFY_AGENT_STUB_API_BASE_URL is set): strip, `^[A-Za-z0-9_-]+$`, base64url
  decode with validation, exactly 32 bytes.
- DIFY_AGENT_API_TOKEN: dify-agent/src/dify_agent/server/auth.py (commit 61ea98246f23): the header
  is `Bearer <token>`, the token stripped and non-empty, compared with hmac.compare_digest against
  the configured token, which api and worker send as AGENT_BACKEND_API_TOKEN.
- SANDBOX_API_KEY: langgenius/dify-sandbox internal/middleware/auth.go (commit 0cf611accfb9):
  `config.App.Key != c.GetHeader("X-Api-Key")` refuses; api sends CODE_EXECUTION_API_KEY.
- PLUGIN_DAEMON_KEY: langgenius/dify-plugin-daemon internal/server/middleware.go `CheckingKey`
  (commit df49729666b5): `c.GetHeader(X_API_KEY) != key` refuses; api and agent_backend send it.
- PLUGIN_DIFY_INNER_API_KEY: langgenius/dify api/controllers/inner_api/wraps.py
  `plugin_inner_api_only` (commit cc7e09cca4c8): `not inner_api_key or inner_api_key !=
  dify_config.INNER_API_KEY_FOR_PLUGIN` refuses; plugin_daemon and agent_backend send it.
- DB_PASSWORD: api/configs/middleware/__init__.py `SQLALCHEMY_DATABASE_URI` (commit 0064a2d8ff0f)
  puts `quote_plus(DB_PASSWORD)` into the URL; PostgreSQL needs it non-empty.
- REDIS_PASSWORD: written as it is into CELERY_BROKER_URL (`redis://:PASSWORD@redis:6379/1`,
  .env.example) and DIFY_AGENT_REDIS_URL, parsed as URLs by their clients: the URL's password must
  be the password.
- SECRET_KEY: api/configs/feature/__init__.py `SecurityConfig.SECRET_KEY: str` (commit
  11607713e085); empty in Dify's .env.example ("Leave empty to auto-generate a persistent key in
  the storage directory"), which is Dify's own business and left alone.
- WEAVIATE_AUTHENTICATION_APIKEY_ALLOWED_KEYS: Weaviate reads a comma-separated list; api sends
  WEAVIATE_API_KEY.
- DIFY_AGENT_LOCAL_SANDBOX_AUTH_TOKEN: the Bearer token agent_backend sends to local_sandbox
  (SHELLCTL_AUTH_TOKEN); an empty one turns authentication off.
"""
import base64
import binascii
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from urllib.parse import quote_plus, unquote, urlparse

import pytest

from helpers import assert_valid_bash, check_plan, compose2sif_forked

# the converted projects (the module-scoped fixture `dify`) are made once, on one xdist worker
pytestmark = pytest.mark.xdist_group("dify")

TESTS = Path(__file__).resolve().parent
DIFY = TESTS.parent.parent / "shared" / "reference" / "dify-1.17.1"
DIFY_ENV_EXAMPLE = (TESTS / "fixtures" / "dify" / "env.example").read_text()
ONE_LINE_ENV = "COMPOSE_PROFILES=weaviate,postgresql\n"
PUBLIC_DEFAULTS = {"SECRET_KEY": "sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U",
                   "DB_PASSWORD": "difyai123456", "REDIS_PASSWORD": "difyai123456",
                   "SANDBOX_API_KEY": "dify-sandbox",
                   "PLUGIN_DAEMON_KEY": "lYkiYYT6owG+71oLerGzA7GXCgOT++6ovaezWAjpCjf+Sjc3ZtU+qUEi",
                   "PLUGIN_DIFY_INNER_API_KEY": "QaHbTe77CtuXmsfyhR7+vRjI/+XbV1AaFy691iy+kGDv2Jvy0/eAh8Y1",
                   "DIFY_AGENT_SERVER_SECRET_KEY": "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY",
                   "DIFY_AGENT_API_TOKEN": "dify-agent-run-token-for-dev-only",
                   "WEAVIATE_AUTHENTICATION_APIKEY_ALLOWED_KEYS": "WVF5YThaHlkYwhGUSmCRgsX3tD5ngdN8pkih"}
PLACEHOLDER = "replace-with-base64url-32-byte-secret"   # in Dify's .env.example
# stand-in for Dify 1.17's ssrf_proxy/squid.conf.template (not obtained); also used by tests/e2e
SQUID_TEMPLATE_STANDIN = (TESTS / "standins" / "dify-squid.conf.template").read_text()
VLLM = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.19.1
    command: ["--model", "/models/m", "--port", "8000"]
"""


def dify_copy(tmp_path: Path, env: str = "dify") -> Path:
    """A copy of Dify's docker/ directory with Dify's .env.example (convert makes .env of it, as
    Dify's docs tell users to) or, for env="one-line", the one-line .env of bench/."""
    if not DIFY.is_dir():
        pytest.fail(f"{DIFY} is missing: ../shared must be beside the repository")
    work = tmp_path / "docker"
    shutil.copytree(DIFY, work)
    for path in work.rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    if env == "dify":
        (work / ".env.example").write_text(DIFY_ENV_EXAMPLE)
    else:
        (work / ".env").write_text(ONE_LINE_ENV)
    (work / "ssrf_proxy" / "squid.conf.template").write_text(SQUID_TEMPLATE_STANDIN)
    return work


def convert(work: Path, *args: str) -> subprocess.CompletedProcess:
    return compose2sif_forked([*args, "convert", "--offline", "-o", "out", "--address-block", "127.45.3.0/24",
                               "--port-base", "30000"], work, {**os.environ, "PYTHONPATH": str(TESTS.parent)})


@pytest.fixture(scope="module", params=["dify", "one-line"])
def dify(request, tmp_path_factory):
    work = dify_copy(tmp_path_factory.mktemp("dify"), request.param)
    proc = convert(work)
    assert proc.returncode == 0, proc.stderr
    # the plan-time knobs' plan (fallback/), which tells each service its address and moved ports;
    # the plan as written (plan.json, where each service gets a loopback of its own) tells nothing
    plan = json.loads((work / "out" / "fallback" / "plan.json").read_text())
    return work, plan, proc, request.param


def service(plan, name):
    return next(s for s in plan["services"] if s["name"] == name)


def env_of(work, name):
    text = (work / "out" / "fallback" / "env" / f"{name}.env").read_text()
    import shlex
    return {k: shlex.split(v)[0] if v else "" for k, _, v in
            (line.partition("=") for line in text.splitlines() if line and not line.startswith("#"))}


def fallback_file(work, *parts):
    """A rendered file as the fallback runs it: its own copy where it differs, else the one plan.json's has."""
    own = work.joinpath("out", "fallback", *parts)
    return own if own.exists() else work.joinpath("out", *parts)


def stored(work):
    return dict(line.split("=", 1) for line in (work / "out" / "secrets.env").read_text().splitlines()
                if "=" in line and not line.startswith("#"))


def test_dotenv_is_dify_s_own_and_the_plan_is_sound(dify):
    work, plan, proc, env = dify
    if env == "dify":
        assert (work / ".env").read_text() == DIFY_ENV_EXAMPLE and "created" in proc.stderr
        assert stat.S_IMODE((work / ".env").stat().st_mode) == 0o600
    else:
        assert (work / ".env").read_text() == ONE_LINE_ENV

    class Plan:  # check_plan reads the planner's objects: plan.json's fields, the env files' values
        def __init__(self, data):
            self.services = [type("S", (), {**s, "ports": [type("P", (), p) for p in s["ports"]],
                                            "environment": env_of(work, s["name"])}) for s in data["services"]]
            self.configs = {str(p.relative_to(work / "out")): p.read_text()
                            for root in (work / "out" / "config", work / "out" / "fallback" / "config")
                            for p in root.rglob("*") if p.is_file()}
    check_plan(Plan(plan))
    assert all(p["host"] >= 1024 for s in plan["services"] for p in s["ports"])


def test_the_plan_as_written_tells_no_service_an_address_or_a_port(dify):
    """plan.json, where each service gets a loopback of its own: every port where Dify's files put
    it, on the service's own address; no address or moved port in any environment or launch line;
    the published ports (nginx's 80, privileged) through a forwarder."""
    work, _, proc, _ = dify
    plan = json.loads((work / "out" / "plan.json").read_text())
    assert plan["fallback"] == "fallback/plan.json" and plan["isolation"].startswith("as written")
    for s in plan["services"]:
        assert all(p["host"] == p["container"] and p["address"] == s["address"] for p in s["ports"]), s["name"]
        text = (work / "out" / "env" / f"{s['name']}.env").read_text()
        assert "127.45.3." not in text and "127.45.3." not in " ".join(s["launch"] or []), s["name"]
    nginx = next(p for p in service(plan, "nginx")["ports"] if p["container"] == 80)
    front = int(nginx["forward"].rsplit(":", 1)[1])
    assert nginx["forward"].startswith("0.0.0.0:") and front >= 1024
    assert f"service 'nginx': published port 80 is privileged; it is published on 0.0.0.0:{front}" in proc.stderr
    assert f"ENTRY_POINTS=('nginx http 0.0.0.0 {front} 80 /install')" in (work / "out" / "run.sh").read_text()


def test_dify_s_env_turns_on_the_collaboration_profile(dify):
    _, plan, _, env = dify
    names = {s["name"] for s in plan["services"]}
    assert len(names) == (16 if env == "dify" else 15)
    assert ("api_websocket" in names) == (env == "dify")


def test_no_public_default_or_placeholder_is_left(dify):
    work, plan, _, _ = dify
    texts = [v for v in PUBLIC_DEFAULTS.values() if v != "dify-sandbox"] + [PLACEHOLDER]  # also an image's name
    for path in (work / "out").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            for secret in texts:
                assert secret not in text, f"{secret} in {path}"
    for s in plan["services"]:
        assert "dify-sandbox" not in env_of(work, s["name"]).values(), s["name"]


def _decode_server_secret_key(value: str) -> bytes:
    """dify-agent's decode_server_secret_key, as its code reads (see the module docstring)."""
    normalized = value.strip()
    if not normalized or not re.fullmatch(r"^[A-Za-z0-9_-]+$", normalized):
        raise ValueError("must be valid unpadded base64url text")
    try:
        decoded = base64.b64decode(normalized + "=" * (-len(normalized) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError("must be valid unpadded base64url text") from exc
    if len(decoded) != 32:
        raise ValueError("must decode to exactly 32 decoded bytes")
    return decoded


def _header_value(value: str) -> bool:
    """Sent as an HTTP header and compared byte for byte: printable, no surrounding space to lose."""
    return bool(value) and value == value.strip() and all(0x21 <= ord(c) < 0x7f for c in value)


def test_every_generated_secret_passes_its_reader_s_check_and_is_shared(dify):
    work, plan, _, env = dify
    values = stored(work)

    def shared(value, reader, *senders):
        """The reader has the value; every other service given the setting has the same one. (With
        the one-line .env, Dify 1.17's api gets none of .env's settings: it has no sender's copy.)"""
        service_name, variable = reader
        assert env_of(work, service_name)[variable] == value, reader
        for service_name, variable in senders:
            assert env_of(work, service_name).get(variable, value) == value, (service_name, variable)

    key = values["DIFY_AGENT_SERVER_SECRET_KEY"]
    assert len(_decode_server_secret_key(key)) == 32
    shared(key, ("agent_backend", "DIFY_AGENT_SERVER_SECRET_KEY"))
    assert env_of(work, "agent_backend")["DIFY_AGENT_STUB_API_BASE_URL"]  # why it is required at start

    token = values["DIFY_AGENT_API_TOKEN"]
    assert _header_value(token)
    shared(token, ("agent_backend", "DIFY_AGENT_API_TOKEN"), ("api", "AGENT_BACKEND_API_TOKEN"),
           ("worker", "AGENT_BACKEND_API_TOKEN"))

    key = values["SANDBOX_API_KEY"]
    assert _header_value(key)
    shared(key, ("sandbox", "API_KEY"), ("api", "CODE_EXECUTION_API_KEY"), ("worker", "CODE_EXECUTION_API_KEY"))
    sandbox_conf = next(b for b in service(plan, "sandbox")["binds"] if b["target"] == "/conf/config.yaml")
    assert re.search(rf"(?m)^\s*key: {key}$", (work / "out" / sandbox_conf["source"]).read_text())

    key = values["PLUGIN_DAEMON_KEY"]
    assert _header_value(key)
    shared(key, ("plugin_daemon", "SERVER_KEY"), ("api", "PLUGIN_DAEMON_KEY"),
           ("agent_backend", "DIFY_AGENT_PLUGIN_DAEMON_API_KEY"))

    key = values["PLUGIN_DIFY_INNER_API_KEY"]
    assert _header_value(key)
    shared(key, ("api", "INNER_API_KEY_FOR_PLUGIN"), ("plugin_daemon", "DIFY_INNER_API_KEY"),
           ("agent_backend", "DIFY_AGENT_INNER_API_KEY"), ("worker", "INNER_API_KEY_FOR_PLUGIN"))

    password = values["DB_PASSWORD"]
    assert password and unquote(quote_plus(password)) == password
    shared(password, ("db_postgres", "POSTGRES_PASSWORD"), ("api", "DB_PASSWORD"), ("plugin_daemon", "DB_PASSWORD"))

    password = values["REDIS_PASSWORD"]
    urls = [env_of(work, name).get(variable) for name, variable in (
        ("api", "CELERY_BROKER_URL"), ("worker", "CELERY_BROKER_URL"), ("agent_backend", "DIFY_AGENT_REDIS_URL"))]
    for url in filter(None, urls):
        assert urlparse(url).password == password and urlparse(url).hostname == "redis", url
    assert urls[2]  # agent_backend's comes from the compose file itself
    redis_conf = fallback_file(work, "config", "redis", "redis", "compose2sif.conf").read_text()
    assert f'requirepass "{password}"' in redis_conf
    shared(password, ("redis", "REDISCLI_AUTH"), ("api", "REDIS_PASSWORD"), ("plugin_daemon", "REDIS_PASSWORD"))
    assert values["DB_PASSWORD"] != password

    key = values["WEAVIATE_AUTHENTICATION_APIKEY_ALLOWED_KEYS"]
    assert "," not in key
    shared(key, ("weaviate", "AUTHENTICATION_APIKEY_ALLOWED_KEYS"), ("api", "WEAVIATE_API_KEY"))

    token = values["DIFY_AGENT_LOCAL_SANDBOX_AUTH_TOKEN"]
    assert _header_value(token)
    shared(token, ("local_sandbox", "SHELLCTL_AUTH_TOKEN"), ("agent_backend", "DIFY_AGENT_LOCAL_SANDBOX_AUTH_TOKEN"))

    if env == "dify":  # empty in Dify's .env.example: Dify keeps a key of its own in its storage
        assert env_of(work, "api")["SECRET_KEY"] == "" and "SECRET_KEY" not in values
    else:
        assert values["SECRET_KEY"] != PUBLIC_DEFAULTS["SECRET_KEY"] and "SECRET_KEY" not in env_of(work, "api")


def test_each_generated_secret_has_the_shape_of_the_default_it_replaces(dify):
    values = stored(dify[0])
    for name, default in PUBLIC_DEFAULTS.items():
        if name not in values:
            continue
        value = values[name]
        assert not set("+/@:%") & set(value), (name, value)   # safe inside URLs
        if name == "DIFY_AGENT_SERVER_SECRET_KEY":
            assert len(value) == len(default) == 43            # 32 bytes, unpadded base64url
            continue
        prefix = "sk-" if default.startswith("sk-") else ""
        body = value[len(prefix):]
        assert value.startswith(prefix) and len(body) >= len(default) - len(prefix), (name, value)
        for chars in ("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789"):
            if not set(chars) & set(default):
                assert not set(chars) & set(body), (name, value)


def test_secrets_are_kept_and_a_stored_one_failing_its_check_is_replaced(tmp_path):
    work = dify_copy(tmp_path)
    proc = convert(work)
    assert proc.returncode == 0, proc.stderr
    assert "DIFY_AGENT_SERVER_SECRET_KEY is set to a placeholder, which means it must be set" in proc.stderr
    first = (work / "out" / "secrets.env").read_text()
    assert stat.S_IMODE((work / "out" / "secrets.env").stat().st_mode) == 0o600
    again = convert(work)
    assert again.returncode == 0 and (work / "out" / "secrets.env").read_text() == first
    assert "earlier convert" not in again.stderr
    # what an earlier compose2sif stored: 48 hex characters (36 bytes) for the agent server key, and a
    # database password the database was initialised with
    old = {**stored(work), "DIFY_AGENT_SERVER_SECRET_KEY": "ab" * 24, "DB_PASSWORD": "initialised with this"}
    (work / "out" / "secrets.env").write_text("".join(f"{k}={v}\n" for k, v in old.items()))
    proc = convert(work)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "earlier convert" in line]
    assert len(lines) == 1 and "DIFY_AGENT_SERVER_SECRET_KEY" in lines[0], proc.stderr
    now = stored(work)
    assert len(_decode_server_secret_key(now["DIFY_AGENT_SERVER_SECRET_KEY"])) == 32
    assert now["DB_PASSWORD"] == "initialised with this"
    assert {k: v for k, v in now.items() if k != "DIFY_AGENT_SERVER_SECRET_KEY"} == \
        {k: v for k, v in old.items() if k != "DIFY_AGENT_SERVER_SECRET_KEY"}


def test_a_user_s_value_that_its_reader_refuses_is_named(tmp_path):
    work = dify_copy(tmp_path)
    (work / ".env").write_text(DIFY_ENV_EXAMPLE.replace(PLACEHOLDER, "ab" * 24))
    proc = convert(work)
    assert proc.returncode == 0, proc.stderr
    assert "DIFY_AGENT_SERVER_SECRET_KEY is set to a value agent_backend will refuse" in proc.stderr
    assert env_of(work, "agent_backend")["DIFY_AGENT_SERVER_SECRET_KEY"] == "ab" * 24   # the user's own


def test_addresses_are_told_only_through_what_each_service_reads(dify):
    work, plan, proc, env = dify
    web, agent = service(plan, "web"), service(plan, "agent_backend")
    assert web["address"] not in ("0.0.0.0", "::") and env_of(work, "web")["HOSTNAME"] == web["address"]
    if env == "dify":  # reaches web through env_file .env; web's server never reads it
        assert env_of(work, "web")["DIFY_BIND_ADDRESS"] == "0.0.0.0"
        assert env_of(work, "web")["PLUGIN_DEBUGGING_HOST"] == "0.0.0.0"
    assert agent["launch"] == ["/.singularity.d/runscript", "uvicorn", "dify_agent.server.app:app",
                               "--host", agent["address"], "--port", "5050"]
    assert agent["address"] not in ("0.0.0.0", "::") and agent["workdir"] == "/app/api"
    for api in ("api", "worker"):
        assert env_of(work, api)["DIFY_BIND_ADDRESS"] == service(plan, api)["address"]
    for name, port in (("sandbox", 8194), ("plugin_daemon", 5002)):  # no setting for their address
        assert service(plan, name)["address"] == "0.0.0.0"
        assert [p["address"] for p in service(plan, name)["ports"] if p["container"] == port] == ["0.0.0.0"]
        assert f"{name} (0.0.0.0:{port})" in proc.stderr.split("listening on all interfaces there: ")[1]


def test_doctor_checks_the_endpoint_each_service_binds(dify):
    from compose2sif import doctor
    work, plan, _, _ = dify
    lines = [text for _, text in doctor.plan_lines(str(work / "out"), fallback=True)]
    agent = service(plan, "agent_backend")["address"]
    assert any(line.startswith(f"service agent_backend: {agent}:5050 ") for line in lines), lines
    assert any(line.startswith("service sandbox would listen on all interfaces (0.0.0.0:8194)") for line in lines)
    assert any(line.startswith(f"service web: {service(plan, 'web')['address']}:3000 ") for line in lines)


def test_browser_facing_urls_follow_the_ssh_tunnel(dify):
    work, plan, proc, env = dify
    front = next(p["host"] for p in service(plan, "nginx")["ports"] if p["container"] == 80)
    assert env_of(work, "web")["NEXT_PUBLIC_SOCKET_URL"] == f"ws://localhost:{front}"
    if env == "dify":
        api = env_of(work, "api")
        assert api["TRIGGER_URL"] == f"http://localhost:{front}"
        assert api["ENDPOINT_URL_TEMPLATE"] == f"http://localhost:{front}/e/{{hook_id}}"
        assert api["CONSOLE_API_URL"] == api["APP_WEB_URL"] == ""    # empty: the page's own origin
    assert proc.stderr.count(f"now name localhost:{front}, the local end of the SSH tunnel") == 1
    # the tunnel `up` prints: ssh -N -L PORT:localhost:PORT ..., then http://localhost:PORT/install
    assert f"FALLBACK_ENTRY_POINTS=('nginx http 0.0.0.0 {front} 80 /install')" in (work / "out" / "run.sh").read_text()


def test_every_service_has_a_working_directory_and_its_writable_paths(dify):
    _, plan, _, _ = dify
    unknown = sorted(s["name"] for s in plan["services"] if not s["workdir"])
    assert unknown == ["local_sandbox"]  # not known offline: named in the convert warnings
    assert service(plan, "api")["workdir"] == service(plan, "worker_beat")["workdir"] == "/app/api"
    assert service(plan, "agent_backend")["workdir"] == "/app/api"
    assert service(plan, "web")["workdir"] == "/app/web"
    for name, path in (("api", "/app/logs"), ("nginx", "/var/cache/nginx"), ("ssrf_proxy", "/var/spool/squid"),
                       ("db_postgres", "/var/run/postgresql"), ("sandbox", "/var/sandbox")):
        assert path in [b["target"] for b in service(plan, name)["binds"]], (name, path)
    assert service(plan, "init_permissions")["launch"] == ["/bin/sh", "-c", "exit 0"]


def test_nginx_runs_without_the_entrypoint_copy_and_needs_no_docker_resolver(dify):
    work, plan, _, env = dify
    nginx = service(plan, "nginx")
    assert nginx["launch"] == ["nginx", "-g", "daemon off;"]
    assert "/docker-entrypoint-mount.sh" not in [b["target"] for b in nginx["binds"]]
    conf = fallback_file(work, "config", "nginx", "root", "etc", "nginx", "conf.d", "default.conf").read_text()
    http = next(p for p in nginx["ports"] if p["container"] == 80)
    assert f"listen {http['address']}:{http['host']};" in conf and "${" not in conf
    assert "127.0.0.11" not in conf
    websocket = "api_websocket" if env == "dify" else "api"   # without the collaboration profile, api serves it
    assert f"set $socket_io_upstream {service(plan, websocket)['address']}:5001;" in conf
    for upstream in ("http://api:5001", "http://web:3000", "http://plugin_daemon:5002"):
        assert upstream in conf
    assert fallback_file(work, "config", "nginx", "root", "etc", "nginx", "proxy.conf").is_file()
    # after `up`, run.sh prints the URL, the SSH tunnel and the admin page
    assert f"FALLBACK_ENTRY_POINTS=('nginx http 0.0.0.0 {http['host']} 80 /install')" in (work / "out" / "run.sh").read_text()


def test_ssrf_proxies_listen_on_their_own_address_and_allow_the_model_servers(tmp_path):
    work = dify_copy(tmp_path)
    (work / "vllm.yaml").write_text(VLLM)
    proc = convert(work, "-f", "docker-compose.yaml", "-f", "vllm.yaml")
    proc2 = compose2sif_forked(["-f", "docker-compose.yaml", "-f", "vllm.yaml", "convert", "--offline", "-o", "out",
                                "--ssrf-allow", "10.1.2.0/24", "--ssrf-allow", "gpu01.cluster"], work, dict(os.environ))
    assert proc.returncode == 0 and proc2.returncode == 0, proc.stderr + proc2.stderr
    plan = json.loads((work / "out" / "plan.json").read_text())
    vllm_address = service(plan, "vllm")["address"]
    for name in ("ssrf_proxy", "agent_ssrf_proxy"):
        proxy = service(plan, name)
        assert proxy["launch"] == ["squid", "-NYC", "-f", "/etc/squid/squid.conf"]
        squid = work / "out" / "config" / name / "squid" / "etc" / "squid"
        assert f"http_port {proxy['address']}:3128" in (squid / "squid.conf").read_text()
        allowed = (squid / "dify_allow_private.conf").read_text()
        assert f"dst {vllm_address}/32 10.1.2.0/24" in allowed and "dstdomain gpu01.cluster" in allowed
        assert proxy["address"] != "0.0.0.0"


def test_run_sh_is_valid_bash_and_shellcheck_clean(dify):
    work, _, _, _ = dify
    assert_valid_bash(work / "out" / "run.sh")


def test_sandbox_gets_fakeroot_only_where_its_ids_map_and_says_so_otherwise(dify):
    work, plan, _, _ = dify
    sandbox = service(plan, "sandbox")
    assert sandbox["fakeroot"]["ids"] == 10999  # 0.2.15: a uid from 10000-10999 per Code run
    assert "CODE_EXECUTION_ENDPOINT" in sandbox["fakeroot"]["without"]
    assert [s["name"] for s in plan["services"] if s["fakeroot"]] == ["sandbox"]
    run_sh = (work / "out" / "run.sh").read_text()
    assert run_sh.count("S_FAKEROOT_IDS=10999 ") == 1 and run_sh.count("S_FAKEROOT_IDS='' ") == len(plan["services"]) - 1


@pytest.mark.parametrize("image,ids", [("langgenius/dify-sandbox:0.2.15", 10999),
                                       ("langgenius/dify-sandbox:0.2.13", 10999),
                                       ("langgenius/dify-sandbox:0.2.12", 65537),  # the fixed uid 65537
                                       ("langgenius/dify-sandbox:latest", 65537)])  # unknown: the wider need
def test_sandbox_ids_follow_its_version(tmp_path, image, ids):
    from compose2sif.load import ProjectOptions, load_project
    from compose2sif.plan import PlanOptions, build_plan
    (tmp_path / "compose.yaml").write_text(f"services:\n  sandbox:\n    image: {image}\n")
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    plan = build_plan(project, PlanOptions(port_base=30000))
    assert plan.service("sandbox").fakeroot["ids"] == ids

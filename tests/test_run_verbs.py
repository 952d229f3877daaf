"""Each file of run/ on its own, and each verb of run.sh from its own file: bash sources the project's
data (the generated header of a converted run.sh), run/lib/*.sh and run/cmd/VERB.sh only, then calls
cmd_VERB. The runtime is the RECORDING STAND-IN (tests/standins/recording-standin-apptainer): it
records its argv and answers `instance list --json` with the file the test writes, so the checks
are on what a verb asks of the runtime and what it tells the user. The real runtime runs the
verbs on the test bed (tests/e2e)."""
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from compose2sif import render
from helpers import run_lib, shellcheck_passes

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "run"
STANDIN = REPO / "tests" / "standins" / "recording-standin-apptainer"
ENGINE_MARKER = "# ---- the engine (the same for every project"

# (no ports: what listens on this machine, e2e test beds included, must not matter here)
COMPOSE = """name: v
services:
  db:
    image: busybox
  web:
    build: ./web
    restart: always
    depends_on: [db]
"""


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The project converted once; out/header.sh is its run.sh's header alone."""
    root = tmp_path_factory.mktemp("converted")
    (root / "compose.yaml").write_text(COMPOSE)
    (root / "web").mkdir()
    (root / "web" / "Dockerfile").write_text("FROM busybox\nCMD [\"sleep\", \"300\"]\n")
    subprocess.run(["python3", "-m", "compose2sif", "-f", str(root / "compose.yaml"), "convert", "--offline",
                    "-o", str(root / "out")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})
    text = (root / "out" / "run.sh").read_text()
    (root / "out" / "header.sh").write_text(text[:text.index(ENGINE_MARKER)])
    return root / "out"


@pytest.fixture
def project(converted, tmp_path):
    """A copy of the converted project for one test (its run.sh finds everything from where it is)."""
    shutil.copytree(converted, tmp_path / "out", symlinks=True)
    (tmp_path / "listing.json").write_text('{"instances": []}')
    yield tmp_path
    stop_dns(tmp_path)


def stop_dns(tmp_path):
    """The project's DNS server, which an `up` of a test started (`down` would stop it)."""
    subprocess.run(["pkill", "-f", f"{tmp_path}/out/bin/x86_64/c2s-loopback --serve-dns"], check=False)


def run_verb(tmp_path, verb_file, *call, background=False, as_uid=None, path="/usr/bin:/bin", **env_extra):
    """bash: the header, run/lib/*.sh, run/cmd/VERB_FILE.sh, then the words of `call` (as user id
    AS_UID where given)."""
    script = (f'source {tmp_path}/out/header.sh && for f in {RUN}/lib/*.sh; do source "$f"; done && '
              f'source {RUN}/cmd/{verb_file}.sh && "$@"')
    env = {"PATH": path, "HOME": str(tmp_path), "C2S_RUNTIME": str(STANDIN),
           "C2S_RECORD": str(tmp_path / "record"), "C2S_STANDIN_LIST": str(tmp_path / "listing.json"), **env_extra}
    argv = ["bash", "-c", script, "bash", *call]
    if as_uid is not None:
        argv = ["setpriv", f"--reuid={as_uid}", f"--regid={as_uid}", "--clear-groups", *argv]
    if background:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def service(tmp_path, name, *fields):
    """The values the header gives service NAME (S_SIF, S_INSTANCE, ...), with HERE resolved."""
    script = f'source {tmp_path}/out/header.sh; load_service "$1"; shift; for v in "$@"; do printf "%s\\n" "${{!v}}"; done'
    proc = subprocess.run(["bash", "-c", script, "bash", name, *fields], capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


def calls(tmp_path):
    record = tmp_path / "record"
    return [c.split("\0")[:-1] for c in record.read_text().split("\036") if c] if record.exists() else []


@contextlib.contextmanager
def standin_init():
    """A STAND-IN instance: an "init" whose child is its start script; its pid, killed (with the child) after."""
    init = subprocess.Popen(["bash", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        for _ in range(100):
            if Path(f"/proc/{init.pid}/task/{init.pid}/children").read_text().strip():
                break
            time.sleep(0.02)
        yield init.pid
    finally:
        os.killpg(init.pid, signal.SIGKILL)  # its child too, not left to sleep on
        init.wait()


def listing(tmp_path, **entries):
    (tmp_path / "listing.json").write_text(json.dumps({"instances": [{"instance": k, **v} for k, v in entries.items()]}))


# ---- the files --------------------------------------------------------------------------------------

def test_run_sh_is_the_files_of_run_joined_in_their_documented_order():
    files = render.engine_files()
    on_disk = sorted(p.relative_to(RUN).as_posix() for p in RUN.rglob("*.sh"))
    assert sorted(files) == on_disk  # every file is joined, once
    assert files[-1] == "main.sh" and files.index("cmd/build.sh") > files.index("lib/storage.sh")
    assert all(len((RUN / f).read_text().splitlines()) <= 600 for f in files)


@pytest.mark.parametrize("rel", sorted(p.relative_to(RUN).as_posix() for p in RUN.rglob("*.sh")))
def test_each_file_sources_on_its_own_and_runs_nothing(rel, tmp_path):
    proc = subprocess.run(["bash", "-c", f'cd {tmp_path}; source {RUN}/{rel} ps; echo "sourced $?"'],
                          capture_output=True, text=True, timeout=10)
    assert proc.stdout == "sourced 0\n" and proc.stderr == "", proc
    assert os.listdir(tmp_path) == []  # (main.sh's main would have run `ps` and made a state directory)


def test_each_file_is_shellcheck_clean():
    if shutil.which("shellcheck") is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is not installed (.ci/run installs it)")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    files = sorted(p.relative_to(RUN).as_posix() for p in RUN.rglob("*.sh"))
    shellcheck_passes(files, cwd=RUN)  # (run/.shellcheckrc)


# ---- the verbs --------------------------------------------------------------------------------------

def test_ps_shows_each_service_and_what_a_killed_run_left(project):
    rundir = project / "out" / "state" / "run"
    rundir.mkdir(parents=True)
    (rundir / "db.status").write_text("started\n")  # as a run killed while db ran leaves it
    proc = run_verb(project, "ps", "cmd_ps")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert rows[0] == ["SERVICE", "INSTANCE", "STATE", "HEALTH", "ADDRESS:PORT", "UPTIME"]
    assert [r[0] for r in rows[1:]] == ["db", "web"] and rows[1][2] == "exited" and rows[2][2] == "stopped", rows
    assert "db: ended without `down`" in proc.stderr
    proc = run_verb(project, "ps", "cmd_ps", "--format", "json")
    states = {row["service"]: (row["state"], row["instance"]) for row in json.loads(proc.stdout)}
    assert states == {"db": ("exited", "v-db"), "web": ("stopped", "v-web")}, proc.stdout
    assert [c[:3] for c in calls(project)] == [["--version"], ["instance", "list", "--json"]] * 2


def test_down_stops_marks_and_with_v_removes_the_volumes(project):
    state = project / "out" / "state"
    (state / "run").mkdir(parents=True)
    (state / "volumes" / "data").mkdir(parents=True)
    (state / "run" / "db.status").write_text("healthy\n")
    proc = run_verb(project, "down", "cmd_down", "-v")
    assert proc.returncode == 0, proc.stderr
    assert not (state / "volumes").exists() and not (state / "run" / "db.status").exists()
    assert (state / "run" / "db.stopped").exists() and (state / "run" / "web.stopped").exists()
    assert "db: ended without `down`" in proc.stderr and "removing volumes" in proc.stderr
    assert not [c for c in calls(project) if c[:2] == ["instance", "stop"]]  # no instance was left to stop


def test_up_starts_an_instance_with_the_services_env_and_reports_one_that_ends_at_once(project):
    sif, instance, env_file = service(project, "db", "S_SIF", "S_INSTANCE", "S_ENV")
    Path(sif).parent.mkdir(exist_ok=True)
    Path(sif).write_text("")  # (the stand-in runs nothing from it)
    # plan mode: the image's start script as it is (the traced start's flags: test_intercept_run)
    proc = run_verb(project, "up", "cmd_up", "-d", "db", C2S_PORT_ISOLATION="plan")
    assert proc.returncode == 1
    assert "run.sh: service db failed: exited right after start" in proc.stderr, proc.stderr
    [start] = [c for c in calls(project) if c[:2] == ["instance", "start"]]
    assert start[-2:] == [sif, instance]
    # (no HOSTNAME: converted --offline, the image's ENV is not known, and it may name one)
    assert start[2:6] == ["--cleanenv", "--no-eval", "--env-file", env_file], start
    assert ["--bind", f"{project}/out/state/hosts:/etc/hosts:ro"] == start[6:8]
    # a registry image is built from docker://REF: its start script is bound in, the definition's own
    startscript = project / "out" / "state" / "run" / f"{Path(sif).stem}.startscript"
    assert ["--bind", f"{startscript}:/.singularity.d/startscript:ro"] == start[8:10]
    definition = (project / "out" / "definitions" / f"{Path(sif).stem}.def").read_text()
    assert startscript.read_text() == "#!/bin/sh\n\n" + definition.split("%startscript\n", 1)[1]
    proc = run_verb(project, "up", "cmd_up", "-d", "nosuch")
    assert proc.returncode == 1 and "no such service: nosuch" in proc.stderr


def test_up_points_at_the_free_port_an_entry_point_published_with_no_host_side_got(project):
    # `ports: ["8080"]` on a web front: the plan says port 0, the forwarders took 40123 (NAME.published)
    setup = ("ENTRY_POINTS=('web http 0.0.0.0 0 8080 /' 'db http 127.0.0.1 0 9000 /admin'); ISOLATION=intercept; "
             'mkdir -p "$RUNDIR" && printf "8080 40123\\n" >"$RUNDIR/web.published" && print_entry_points')
    proc = run_verb(project, "up", "eval", setup)
    assert proc.returncode == 0, proc
    node = subprocess.run(["hostname", "-f"], capture_output=True, text=True).stdout.strip()
    assert f"web: http://{node}:40123/" in proc.stderr and "ssh -N -L 40123:localhost:40123" in proc.stderr
    assert ":0/" not in proc.stderr and "db:" not in proc.stderr, proc.stderr  # not started: no port to name


def test_a_bind_source_the_user_cannot_create_fails_the_service_in_one_line(project):
    # directus' ./data/database, in a project directory the user cannot write (here: under a file)
    (project / "blocker").write_text("")
    setup = (f"S_EMPTY=() S_FILLS=() S_KEEPS=() S_MOUNT_POINTS=() S_MKDIRS=({project}/blocker/data/database); "
             "prepare_dirs")
    proc = run_verb(project, "up", "eval", setup)
    assert proc.returncode == 1 and proc.stderr == "", proc
    assert proc.stdout == (f"the bind source {project}/blocker/data/database does not exist, and this user cannot "
                           "create it (Not a directory): create it, or make its parent writable\n"), proc.stdout


def test_restart_stops_then_starts_the_service(project):
    sif, instance = service(project, "db", "S_SIF", "S_INSTANCE")
    Path(sif).parent.mkdir(exist_ok=True)
    Path(sif).write_text("")
    proc = run_verb(project, "restart", "cmd_restart", "db")
    assert proc.returncode == 1 and "run.sh: db: failed exited right after start" in proc.stderr, proc.stderr
    starts = [c for c in calls(project) if c[:2] == ["instance", "start"]]
    assert len(starts) == 1 and starts[0][-1] == instance
    assert not (project / "out" / "state" / "run" / "db.stopped").exists()  # the start took the stop's mark away
    # no service named: each one that has a status (started since `down`), as docker compose restarts all
    (project / "out" / "state" / "run" / "web.status").write_text("failed exited right after start\n")
    Path(service(project, "web", "S_SIF")[0]).write_text("")
    proc = run_verb(project, "restart", "cmd_restart")
    starts = [c for c in calls(project) if c[:2] == ["instance", "start"]]
    assert len(starts) == 3 and starts[1][-1] == instance and starts[2][-1].endswith("web"), proc.stderr
    assert proc.returncode == 1 and "run.sh: web: failed" in proc.stderr  # (the stand-in's instances end at once)
    (project / "out" / "state" / "run" / "db.status").unlink()
    (project / "out" / "state" / "run" / "web.status").unlink()
    proc = run_verb(project, "restart", "cmd_restart")
    assert proc.returncode == 0 and "restart: no service was started since `down`" in proc.stderr, proc.stderr


def test_restart_does_not_wait_for_the_dependencies(project):
    """`restart web` while db has no status (stopped, or never started by this run): Compose restarts
    web at once; before, run.sh waited on db's status file forever."""
    sif, instance = service(project, "web", "S_SIF", "S_INSTANCE")
    Path(sif).parent.mkdir(exist_ok=True)
    Path(sif).write_text("")
    proc = run_verb(project, "restart", "cmd_restart", "web")  # run_verb's timeout fails a hang
    assert "waiting for db" not in proc.stderr, proc.stderr
    starts = [c for c in calls(project) if c[:2] == ["instance", "start"]]
    assert len(starts) == 1 and starts[0][-1] == instance, calls(project)

def test_logs_prints_the_log_the_runtime_names(project):
    (project / "db.out").write_text("hello from db\n")
    listing(project, **{"v-db": {"pid": 1, "logOutPath": str(project / "db.out"), "logErrPath": ""}})
    proc = run_verb(project, "logs", "cmd_logs", "db")
    assert proc.returncode == 0 and proc.stdout == "hello from db\n", proc.stderr
    listing(project)
    proc = run_verb(project, "logs", "cmd_logs", "web")
    assert proc.returncode == 1 and proc.stderr == "run.sh: web has not run since `up`\n", proc.stderr


def test_logs_shows_only_this_runs_output(project):
    """The runtime keeps an instance's log files after `down`: a service that has not started since
    `up` (here its image is missing) shows none of an earlier run's output."""
    sif, instance = service(project, "db", "S_SIF", "S_INSTANCE")
    kept = project / ".apptainer" / "instances" / "logs" / "node" / "root" / f"{instance}.out"
    kept.parent.mkdir(parents=True)
    kept.write_text("an earlier run\n")
    proc = run_verb(project, "logs", "cmd_logs", "db")
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "run.sh: db has not run since `up`\n")
    Path(sif).parent.mkdir(exist_ok=True)
    Path(sif).write_text("")
    run_verb(project, "up", "cmd_up", "-d", "db")  # starts it (the stand-in's instance ends at once)
    assert not kept.exists()  # the start cleared the runtime's logs
    proc = run_verb(project, "logs", "cmd_logs", "db")
    assert proc.returncode == 1 and proc.stderr == "run.sh: no logs for db yet\n", proc.stderr
    kept.write_text("this run\n")  # what the runtime writes while it runs
    proc = run_verb(project, "logs", "cmd_logs", "db")
    assert (proc.returncode, proc.stdout) == (0, "this run\n"), proc.stderr
    Path(sif).unlink()
    proc = run_verb(project, "up", "cmd_up", "-d", "db")
    assert proc.returncode == 1 and "is missing" in proc.stderr, proc.stderr
    proc = run_verb(project, "logs", "cmd_logs", "db")
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "run.sh: db has not run since `up`\n")


def test_exec_runs_the_command_in_the_instance_with_the_services_env(project):
    env_file, workdir = service(project, "db", "S_ENV", "S_WORKDIR")
    proc = run_verb(project, "exec", "cmd_exec", "db", "echo", "hi")
    assert proc.returncode == 1 and "db is not running" in proc.stderr
    with standin_init() as init:
        listing(project, **{"v-db": {"pid": init}})
        proc = run_verb(project, "exec", "cmd_exec", "db", "echo", "hi")
        assert proc.returncode == 0, proc.stderr
        pwd = ["--pwd", workdir] if workdir else []
        assert calls(project)[-1] == ["exec", "--cleanenv", "--no-eval", "--env-file", env_file, *pwd,
                                      "instance://v-db", "echo", "hi"]


def test_env_flags_give_the_nodes_host_name_as_hostname_where_the_plan_says_so(project):
    """Docker sets HOSTNAME to the container's host name; here the node's, what the service's
    gethostname() returns (Airflow's worker healthcheck pings celery@$HOSTNAME)."""
    flags = 'S_ENV=/x/db.env && env_flags && printf "%s\\n" "${ENV_FLAGS[@]}"'
    told = run_lib(project, f"S_HOSTNAME_ENV=1 && {flags}")
    assert told.stdout.split("\n")[-3:-1] == ["--env", f"HOSTNAME={socket.gethostname()}"], told.stdout + told.stderr
    assert "HOSTNAME" not in run_lib(project, f"S_HOSTNAME_ENV=0 && {flags}").stdout


def test_build_builds_into_the_cache_under_the_definitions_digest(project):
    storage = project / "storage"
    key = Path(service(project, "web", "S_SIF")[0]).stem
    definition = project / "out" / "definitions" / f"{key}.def"
    digest = hashlib.sha256(definition.read_bytes()).hexdigest()
    proc = run_verb(project, "build", "cmd_build", C2S_STORAGE=str(storage))
    # the stand-in writes no SIF: every build fails, is retried alone, and its log is shown
    assert proc.returncode == 1 and f"building image {key} failed" in proc.stderr, proc.stderr
    builds = [c for c in calls(project) if c[:1] == ["build"] and c[-1] == str(definition)]
    assert len(builds) == 2, calls(project)  # the build, then its retry alone
    assert builds[0][1] == "--force" and builds[0][-2].startswith(f"{storage}/sif/{digest}.sif."), builds[0]
    pulled = [c for c in calls(project) if c[:1] == ["build"] and c[-1] == "docker://busybox"]
    assert pulled and "--fakeroot" not in pulled[0], calls(project)  # a registry image: no definition file
    assert run_verb(project, "build", "cmd_build", "--pul").stderr.strip() == \
        "run.sh: build: unknown argument --pul (usage: build [--pull] [--force])"


def test_pull_leaves_built_images_alone(project):
    proc = run_verb(project, "pull", "cmd_pull", "web")
    assert proc.returncode == 0 and "pull: web is built, not pulled" in proc.stderr, proc.stderr
    assert "pull: no image to pull for web" in proc.stderr
    assert calls(project) == []  # nothing asked of the runtime or the registry
    proc = run_verb(project, "pull", "cmd_pull", "--all")
    assert proc.returncode == 1 and "pull: unknown option --all" in proc.stderr


def test_storage_tells_doctor_where_sifs_and_caches_go(project):
    storage = project / "storage"
    proc = run_verb(project, "storage", "cmd_storage", C2S_STORAGE=str(storage))
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert rows[0] == ["storage", str(storage), "set by C2S_STORAGE"], rows
    assert rows[1] == ["SIF cache", f"{storage}/sif", ""] and rows[2][:2] == ["build cache", f"{storage}/cache"]


def test_supervise_restarts_an_ended_service_until_another_supervisor_takes_over(project):
    sif, instance = service(project, "web", "S_SIF", "S_INSTANCE")
    Path(sif).parent.mkdir(exist_ok=True)
    Path(sif).write_text("")
    rundir = project / "out" / "state" / "run"
    rundir.mkdir(parents=True)
    (rundir / "supervised").write_text("web\n")
    (rundir / "db.status").write_text("started\n")  # web's dependency, as `up` left it
    (rundir.parent / "logs").mkdir()
    pid_file = rundir / "supervisor.pid"
    # as `up -d` does before the supervisor looks: supervisor.pid names it
    supervisor = run_verb(project, "supervise", "eval", 'echo "$BASHPID 0" >"$RUNDIR/supervisor.pid"; cmd_supervise',
                          background=True)
    try:
        for _ in range(300):
            if any(c[:2] == ["instance", "start"] for c in calls(project)):
                break
            time.sleep(0.05)
        assert [c[-1] for c in calls(project) if c[:2] == ["instance", "start"]][:1] == [instance]
        pid_file.write_text("1 0\n")  # another `up` took over: this supervisor ends at its next cycle
        _, err = supervisor.communicate(timeout=20)
    finally:
        with contextlib.suppress(ProcessLookupError):  # (nothing is left of a supervisor that ended)
            os.killpg(supervisor.pid, signal.SIGKILL)
    assert supervisor.returncode == 0, err
    assert "web ended (exit code unknown); restarting (restart: always)" in err, err


# ---- the runtime's mode -----------------------------------------------------------------------------

def runtime_mode_as(workdir, uid):
    """RT_MODE and WRITABLE_ROOT as detect_runtime finds them, run as user id UID, with the
    RECORDING STAND-IN answering `buildcfg` from WORKDIR/buildcfg; the mode is kept in WORKDIR/run."""
    script = (f'source {RUN}/lib/core.sh && source {RUN}/lib/runtime.sh && RUNDIR={workdir}/run && '
              'detect_runtime && echo "$RT_MODE $WRITABLE_ROOT"')
    env = {"PATH": "/usr/bin:/bin", "C2S_RUNTIME": str(STANDIN), "C2S_RECORD": str(workdir / "record"),
           "C2S_STANDIN_BUILDCFG": str(workdir / "buildcfg")}
    proc = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "bash", "-c", script],
                          env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture
def node_dir():
    """A directory another user can read (pytest's tmp_path is under a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="c2s-mode-"))
    path.chmod(0o755)
    yield path
    stop_dns(path)
    shutil.rmtree(path)


def test_runtime_mode_comes_from_buildcfg_and_the_config_and_is_asked_once(node_dir):
    """The setuid bit of a starter-suid beside the binary is not asked: what the runtime says is
    (Debian puts its starter under /usr/lib/TRIPLET). A user other than root runs run.sh; the
    starter-suid is root-owned and setuid, so this test runs as root, as the e2e ones do."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("makes a root-owned setuid file and runs as another user: run as root, with setpriv")
    workdir = node_dir
    for sub in ("run", "lib/apptainer/bin", "lib/singularity/bin", "etc/apptainer", "etc/singularity"):
        (workdir / sub).mkdir(parents=True)
    for d in workdir.rglob("*"):
        d.chmod(0o755)
    (workdir / "run").chmod(0o777)
    (workdir / "record").touch()
    (workdir / "record").chmod(0o666)
    for flavour in ("apptainer", "singularity"):
        starter = workdir / "lib" / flavour / "bin" / "starter-suid"
        starter.write_text("")
        starter.chmod(0o4755)
    conf = workdir / "etc" / "apptainer" / "apptainer.conf"
    conf.write_text("# allow setuid = no\nallow setuid = yes\nallow setuid-mount squashfs = no\n")
    (workdir / "buildcfg").write_text(f"APPTAINER_SUID_INSTALL=1\nLIBEXECDIR={workdir}/lib\nSYSCONFDIR={workdir}/etc\n")
    nobody = 65534

    def buildcfg_calls():
        return sum(1 for c in calls(workdir) if c == ["buildcfg"])

    # Apptainer installed setuid takes a directory overlay (the kernel's); SingularityCE refuses it
    assert runtime_mode_as(workdir, nobody) == "setuid overlay"
    assert buildcfg_calls() == 1
    assert runtime_mode_as(workdir, nobody) == "setuid overlay" and buildcfg_calls() == 1  # kept in RUNDIR
    assert runtime_mode_as(workdir, 0).startswith("root ")
    conf.write_text("allow setuid = no\n")  # the config is read each time: the runtime reads it each time
    assert runtime_mode_as(workdir, nobody).startswith("unprivileged ")
    conf.write_text("allow setuid = yes\n")

    def answer(text, root=False):
        (workdir / "run" / "runtime.buildcfg").unlink()
        (workdir / "buildcfg").write_text(text)
        said = runtime_mode_as(workdir, nobody)
        return said if root else said.split()[0]

    assert answer(f"APPTAINER_SUID_INSTALL=0\nLIBEXECDIR={workdir}/lib\nSYSCONFDIR={workdir}/etc\n") == "unprivileged"
    # SingularityCE and Singularity 3.x spell it SINGULARITY_*, their config singularity.conf
    (workdir / "etc" / "singularity" / "singularity.conf").write_text("allow setuid = yes\n")
    assert answer(f"SINGULARITY_SUID_INSTALL=1\nLIBEXECDIR={workdir}/lib\nSYSCONFDIR={workdir}/etc\n",
                  root=True) == "setuid tmpfs"
    (workdir / "lib" / "singularity" / "bin" / "starter-suid").chmod(0o755)  # built setuid, installed without the bit
    assert answer(f"SINGULARITY_SUID_INSTALL=1\nLIBEXECDIR={workdir}/lib\nSYSCONFDIR={workdir}/etc\n") == "unprivileged"
    assert answer("") == "unprivileged"  # a runtime with no buildcfg


# ---- images that cannot be built here ---------------------------------------------------------------

def test_build_and_up_refuse_in_one_line_where_no_definition_can_be_built_and_use_a_dropped_sif(converted, node_dir):
    """A node where user namespaces are off: a STAND-IN `unshare` that fails as the real one does
    there is first on PATH, and run.sh runs as a user other than root (root builds anything)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("runs run.sh as another user: run as root, with setpriv")
    shutil.copytree(converted, node_dir / "out", symlinks=True)
    standins = node_dir / "bin"
    standins.mkdir()
    (standins / "unshare").write_text("#!/bin/sh\n# STAND-IN unshare: user namespaces are off on this node\n"
                                      "echo 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    (standins / "unshare").chmod(0o755)
    (node_dir / "listing.json").write_text('{"instances": []}')
    (node_dir / "record").touch()
    subprocess.run(["chown", "-R", "65534:65534", str(node_dir)], check=True)
    nobody = {"as_uid": 65534, "path": f"{standins}:/usr/bin:/bin", "C2S_STORAGE": str(node_dir / "storage")}
    out = node_dir / "out"
    web = Path(service(node_dir, "web", "S_SIF")[0]).stem
    db = Path(service(node_dir, "db", "S_SIF")[0]).stem

    # db runs a registry image: built from docker://busybox, no definition file, so not refused
    proc = run_verb(node_dir, "build", "cmd_build", **nobody)
    assert proc.returncode == 1
    assert proc.stderr == (f"run.sh: image {web} cannot be built here: its definition needs fakeroot "
                           f"(unprivileged {STANDIN}, no user namespaces); build it where user namespaces or root "
                           f"exist (run.sh build there) and copy it to {out}/sif/{web}.sif, or use --remote where "
                           "the site has a build service\n"), proc.stderr
    proc = run_verb(node_dir, "up", "cmd_up", "-d", "web", **nobody)  # web depends on db
    assert proc.returncode == 1 and f"image {web} cannot be built here" in proc.stderr, proc.stderr
    assert not [c for c in calls(node_dir) if c[0] in ("build", "instance")], calls(node_dir)  # nothing built or started

    (out / "sif").mkdir(exist_ok=True)
    (out / "sif" / f"{web}.sif").write_text("built elsewhere")  # dropped in place: no record of ours
    proc = run_verb(node_dir, "build", "cmd_build", **nobody)
    assert "cannot be built here" not in proc.stderr, proc.stderr  # (the stand-in builds no SIF for db)
    assert [c[-1] for c in calls(node_dir) if c[0] == "build"] == ["docker://busybox"] * 2, calls(node_dir)
    (out / "sif" / f"{db}.sif").write_text("built elsewhere")
    proc = run_verb(node_dir, "build", "cmd_build", **nobody)
    assert proc.returncode == 0, proc.stderr
    assert len([c for c in calls(node_dir) if c[0] == "build"]) == 2, calls(node_dir)  # none more
    assert (out / "sif" / f"{web}.sif").read_text() == "built elsewhere"
    proc = run_verb(node_dir, "build", "cmd_build", "--force", **nobody)  # --force would build them again
    assert proc.returncode == 1 and f"image {web} cannot be built here" in proc.stderr, proc.stderr
    proc = run_verb(node_dir, "up", "cmd_up", "-d", "db", **nobody)  # started from the dropped SIF
    assert "cannot be built here" not in proc.stderr, proc.stderr
    assert [c for c in calls(node_dir) if c[:2] == ["instance", "start"]][0][-2] == str(out / "sif" / f"{db}.sif")


def test_a_setuid_overlay_gets_user_owned_copies_of_the_images_unwritable_directories(tmp_path):
    """In setuid mode the image's own find lists the directories the user cannot write (once per
    SIF); each is made in the overlay's upper layer, names with spaces or newlines included. The
    runtime here is a STAND-IN script that prints such a list and counts its calls."""
    standin = tmp_path / "standin-runtime"
    standin.write_text("#!/bin/sh\necho x >>\"$0.calls\"\nprintf '/etc\\0/var/lib/db\\0/opt/a b\\0/opt/new\\nline\\0'\n")
    standin.chmod(0o755)
    sif = tmp_path / "img.sif"
    sif.write_text("")
    (tmp_path / "run").mkdir()
    script = (f'source {RUN}/lib/core.sh && source {RUN}/lib/runtime.sh && RUNDIR={tmp_path}/run RT={standin} '
              f'S_SIF={sif} RT_MODE="$0" && shadow_image_dirs {tmp_path}/ov && shadow_image_dirs {tmp_path}/ov2')
    subprocess.run(["bash", "-c", script, "setuid"], check=True, timeout=30)
    for ov in ("ov", "ov2"):
        upper = tmp_path / ov / "upper"
        assert sorted(str(p.relative_to(upper)) for p in upper.rglob("*")) == \
            ["etc", "opt", "opt/a b", "opt/new\nline", "var", "var/lib", "var/lib/db"]
        assert (tmp_path / ov / "work").is_dir()
    assert (tmp_path / "standin-runtime.calls").read_text() == "x\n"  # the list is kept in RUNDIR
    subprocess.run(["bash", "-c", script.replace("/ov", "/ov3"), "unprivileged"], check=True, timeout=30)
    assert not (tmp_path / "ov3").exists()

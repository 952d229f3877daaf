"""Hostile values, as a repository cloned from a stranger would carry them (issue 11). No compose or
.env value may run a command on the host, add a section to a definition, or touch a file outside
the output directory. Each project (the nine payloads share one, as do the cases with a value in
one field: a service and a sentinel file each) goes through `convert` once and then every run.sh verb (build,
up, ps, logs, exec, restart, down) under a RECORDING STAND-IN for apptainer
(tests/standins/recording-standin-apptainer, in its running mode: it logs its argv and plays
instances that run until `down`), on a runtime with --no-eval; the verbs that hand values to the
runtime run again on one without. The real Apptainer runs a few of them in
tests/e2e/test_hostile_e2e.py.
"""
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, STANDIN, compose2sif_forked, free_ports

SECTIONS = {"%setup", "%files", "%environment", "%post", "%runscript", "%startscript", "%test", "%labels", "%help",
            "%arguments"}

# {S} is the sentinel file a payload tries to create; each payload is one way a value could reach a shell
PAYLOADS = ["$$(touch {S})", "`touch {S}`", "x; touch {S}", "x' ; touch {S} ; '", 'x" ; touch {S} ; "',
            "x\ntouch {S}\n", "x\n%setup\n    touch {S}\n", "x\\", "\\$$(touch {S})"]


def _yaml_str(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML string


def _payload(i: int) -> str:
    return PAYLOADS[i].replace("{S}", "{S}-values-%d" % i)


def _values_service(i: int) -> str:
    """app<I>: payload I (its sentinel {S}-values-I) in every place a value reaches run.sh, an env
    file or a definition."""
    p = _payload(i)
    q = _yaml_str(p)
    return f"""  app{i}:
    build:
      context: .
      args:
        A: {q if chr(10) not in p else '"no newline: refused in build args"'}
    image: app{i}
    command: ["sh", "-c", {q}]
    entrypoint: [{q}]
    working_dir: {_yaml_str("/w" + p.replace(chr(10), ""))}
    environment:
      P: {q}
      {_yaml_str("BAD" + p.replace(chr(10), " "))}: x
    healthcheck:
      test: ["CMD-SHELL", {q}]
      interval: 1s
    labels:
      l: {q}
    stop_signal: SIGTERM
    volumes:
      - type: bind
        source: ./data
        target: {_yaml_str("/data" + p.replace(chr(10), ""))}
"""


# The payloads go through one project: the verbs' cost is mostly per project and per service. Each
# payload has its own service and sentinel file (PWNED-values-I); web depends on them all and
# carries every payload in an environment list.
VALUES = ("services:\n" + "".join(_values_service(i) for i in range(len(PAYLOADS))) + f"""  web:
    image: busybox
    depends_on: [{", ".join(f"app{i}" for i in range(len(PAYLOADS)))}]
    environment:
""" + "".join(f"      - {_yaml_str(f'Q{i}=' + _payload(i))}\n" for i in range(len(PAYLOADS))) + """    ports: ["127.0.0.1:%d:8080"]
""" % free_ports(1)[0])


# A hostile value in one field each, one service each (the service named after the case); the
# sentinel file of each is PWNED-<service>.
FIELDS = """services:
  gpu-device-ids:
    image: busybox
    gpus: [{driver: nvidia, device_ids: ["0$$(touch {S}-gpu-device-ids)", "1`touch {S}-gpu-device-ids`"]}]
  deploy-devices:
    image: busybox
    deploy: {resources: {reservations: {devices: [{capabilities: [gpu], device_ids: ["0;touch {S}-deploy-devices"]}]}}}
  image-subst:
    image: "busybox$$(touch {S}-image-subst)"
  volume-name-traversal:
    image: busybox
    volumes: ["../../victim:/v"]
  named-volume-odd:
    image: busybox
    volumes: ["vol:/v"]
  tmpfs-and-user:
    image: busybox
    tmpfs: ["/t$$(touch {S}-tmpfs-and-user)"]
    user: "1000$$(touch {S}-tmpfs-and-user)"
  dotenv-values:
    image: busybox
    environment: [A, B, C]
  dockerfile-hostile:
    build: .
volumes: {vol: {name: "../../victim"}}
"""
# what dotenv-values reads from the project's .env
FIELDS_DOTENV = "A=$(touch {S}-dotenv-values)\nB='`touch {S}-dotenv-values`'\nC=\"x\\\\\"\n"

# (id, compose text, .env text, compose file name): the list and the classes they stand for
CASES = [
    ("values", VALUES, "", "compose.yaml"),
    ("fields", FIELDS, FIELDS_DOTENV, "compose.yaml"),
    ("restart-arithmetic", """services:
  app:
    image: busybox
    restart: "on-failure:a[$$(touch {S})]"
""", "", "compose.yaml"),
    ("service-name-traversal", "services:\n  ../../../victim/x:\n    image: busybox\n", "", "compose.yaml"),
    ("service-name-subst", 'services:\n  "a$$(touch {S})":\n    image: busybox\n', "", "compose.yaml"),
    ("service-name-quote", "services:\n  \"a'b\":\n    image: busybox\n", "", "compose.yaml"),
    ("project-newline", "services:\n  app:\n    image: busybox\n", "COMPOSE_PROJECT_NAME='x\ntouch {S}'\n",
     "compose.yaml"),
    ("project-traversal", "services:\n  app:\n    image: busybox\n", "COMPOSE_PROJECT_NAME=x/../../../escaped\n",
     "compose.yaml"),
    ("file-name-newline", "services:\n  app:\n    image: busybox\n", "", "c\ntouch {S}\n.yaml"),
    ("image-newline", 'services:\n  app:\n    image: "busybox\\n%setup\\n    touch {S}"\n', "", "compose.yaml"),
    ("build-arg-newline", """services:
  app:
    build: {context: ., args: {A: "1\\n%setup\\n    touch {S}"}}
""", "", "compose.yaml"),
    ("volume-subpath", """services:
  app:
    image: busybox
    volumes: [{type: volume, source: v, target: /v, volume: {subpath: ../../../victim}}]
volumes: {v: {}}
""", "", "compose.yaml"),
    ("bind-path-separators", """services:
  app:
    image: busybox
    volumes: ["./a,b:/x", "./c^d:/y"]
""", "", "compose.yaml"),
    ("name-collision", "services:\n  a-b:\n    image: busybox\n  a_b:\n    image: busybox\n  a.b:\n    image: busybox\n",
     "", "compose.yaml"),
    ("hostname", """services:
  app:
    image: busybox
    hostname: "h$$(touch {S})"
""", "", "compose.yaml"),
    ("extra-host", """services:
  app:
    image: busybox
    extra_hosts: ["h$$(touch {S}):127.0.0.1"]
""", "", "compose.yaml"),
    ("secret-file", """services:
  app:
    image: busybox
    secrets: [s]
secrets: {s: {file: "../../victim"}}
""", "", "compose.yaml"),
]

DOCKERFILE = ('FROM busybox\nARG A\nENV X="$(touch {S})" Y="`touch {S}`"\nLABEL a="\\n%setup\\n touch {S}"\n'
              'RUN echo "$A" \\\n  && true\nWORKDIR /w$(touch {S})\nCMD ["sh", "-c", "$(touch {S})"]\n')


def _tree(root: Path, skip: Path):
    """path -> (mode, sha256 or link target) of everything under root except skip."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if here / d != skip]
        for name in dirnames + filenames:
            path = here / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                content = None
            found[str(path)] = (stat.S_IMODE(info.st_mode), content)
    return found


def _calls(record: Path):
    if not record.exists():
        return []
    return [chunk.split(b"\0")[:-1] for chunk in record.read_bytes().split(b"\036")[:-1]]


def _live_instances(instances: Path):
    """The stand-in instances whose init still runs (a zombie has ended)."""
    live = []
    for record in instances.iterdir():
        try:
            stat_line = Path(f"/proc/{record.read_text().strip()}/stat").read_text()
        except (FileNotFoundError, ValueError):
            continue
        if stat_line.rsplit(")", 1)[1].split()[0] != "Z":
            live.append(record.name)
    return live


def _one_error_line(proc):
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if not line.startswith("WARN ")]
    assert len(errors) == 1 and errors[0].startswith("compose2sif: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr


def check_definitions(out: Path):
    for definition in (out / "definitions").glob("*.def"):
        headers = [line.split()[0] for line in definition.read_text().splitlines() if line.startswith("%")]
        assert "%setup" not in headers, definition.read_text()
        assert set(headers) <= SECTIONS and len(headers) == len(set(headers)), (definition, headers)


# The verbs each case runs on a runtime with --no-eval, then the ones that hand values to the
# runtime (where a runtime without --no-eval takes the escaped env files) on one without: `up`
# and `exec`. (`restart` starts a service with the same flags as `up`: it runs on the first.)
def _verbs(names, eval_runtime):
    if eval_runtime:
        return [["up", "-d"], *[["exec", n, "true"] for n in names], ["down"]]
    return [["build", "--force"], ["up", "-d"], ["ps"], ["ps", "--format", "json"], *[["logs", n] for n in names],
            *[["exec", n, "true"] for n in names], ["restart", names[0]], ["down"], ["down", "-v"]]


VERB_OUTPUTS = {}  # out dir -> [(args, eval runtime, exit code, stderr)] of run_hostile's verbs: for failures' messages


def run_hostile(tmp_path, text, dotenv, filename):
    """convert, then the verbs under the recording stand-in, on a runtime with --no-eval and on one
    without. Returns (convert, out dir, calls)."""
    root = tmp_path / "root"  # everything the test watches lives here
    project, home, victim = root / "proj" / "a" / "b", root / "home", root / "victim"
    for d in (project / "data", home, victim):
        d.mkdir(parents=True)
    (victim / "x").write_text("keep me\n")
    sentinel = root / "PWNED"
    fill = lambda t: t.replace("{S}", str(sentinel))  # noqa: E731
    (project / filename).write_text(fill(text))
    (project / ".env").write_text(fill(dotenv))
    (project / "Dockerfile").write_text(fill(DOCKERFILE))
    out = root / "out"
    record, instances = tmp_path / "record", tmp_path / "instances"
    instances.mkdir()
    # the stand-in in its running mode: what `up` starts runs until `down`, so no verb waits out a timeout
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": str(REPO), "C2S_RUNTIME": str(STANDIN), "C2S_RECORD": str(record),
           "C2S_STANDIN_INSTANCES": str(instances), "C2S_SIF_CACHE": str(tmp_path / "sif-cache")}
    before = _tree(root, out)
    convert = compose2sif_forked(["-f", filename, "convert", "--offline", "-o", str(out)], project, env)
    assert "Traceback" not in convert.stderr and "internal error" not in convert.stderr, convert.stderr
    bind_sources = set()
    if convert.returncode != 0:
        _one_error_line(convert)
        assert not out.exists() or not (out / "run.sh").exists()
    else:
        check_definitions(out)
        plan = json.loads((out / "plan.json").read_text())
        for key in plan["images"]:  # so that `up` reaches `instance start`
            (out / "sif" / f"{key}.sif").write_text("stand-in image\n")
        names = [s["name"] for s in plan["services"]]
        bind_sources = {os.path.normpath(os.path.join(out, b["source"])) for s in plan["services"]
                        for b in s["binds"] if b["kind"] == "bind" and b["create"]}
        for eval_runtime in (False, True):
            for args in _verbs(names, eval_runtime):
                proc = subprocess.run([str(out / "run.sh"), *args], cwd=project, capture_output=True, text=True,
                                      env={**env, "C2S_STANDIN_EVAL": "1" if eval_runtime else "0"}, timeout=120)
                VERB_OUTPUTS.setdefault(str(out), []).append((args, eval_runtime, proc.returncode, proc.stderr))
                assert "syntax error" not in proc.stderr and "command not found" not in proc.stderr, \
                    (args, eval_runtime, proc.stderr)
                if args == ["ps", "--format", "json"]:
                    assert [r["service"] for r in json.loads(proc.stdout)] == names
            assert not _live_instances(instances), "`down` left instances running"
    ran = sorted(path.name for path in root.glob(sentinel.name + "*"))
    assert not ran, f"a value ran a command on the host: {ran}"
    after = _tree(root, out)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    # a bind mount's missing source directory is created, as Docker Compose does (create_host_path)
    changed -= {p for p in changed if p not in before and p in bind_sources and not os.listdir(p)}
    assert not changed, f"files outside the output dir were touched: {sorted(changed)}"
    return convert, out, _calls(record)


# what `convert` answers where it refuses (one line naming the file, service and key); every other
# case converts and runs as data
REFUSED = {"restart-arithmetic":
           "invalid restart policy", "service-name-traversal": "additional properties", "service-name-subst":
           "additional properties", "service-name-quote": "additional properties", "project-newline":
           "invalid project name", "project-traversal": "invalid project name", "image-newline": "control character",
           "build-arg-newline": "control character", "volume-subpath": "leads outside state/",
           "bind-path-separators": "apptainer's --bind reads as a separator", "secret-file": "is not a file",
           "hostname": "services.app.hostname: 'h$(touch", "extra-host": "services.app.extra_hosts: 'h$(touch"}


CASE_BY_NAME = {case[0]: case for case in CASES}


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """run_hostile of a case, done once: the tests that look at the same case share it."""
    done = {}

    def run(name):
        if name not in done:
            _, text, dotenv, filename = CASE_BY_NAME[name]
            done[name] = run_hostile(tmp_path_factory.mktemp(name), text, dotenv, filename)
        return done[name]
    return run


# under xdist, the tests that share a case's run (hostile_run) run on one worker: it runs once
SHARED_RUN = {"values": pytest.mark.xdist_group("hostile-values"),
              "fields": pytest.mark.xdist_group("hostile-fields"),
              "name-collision": pytest.mark.xdist_group("hostile-name-collision")}


@pytest.mark.parametrize("name", [pytest.param(name, marks=SHARED_RUN.get(name, ())) for name in CASE_BY_NAME])
def test_hostile_value_stays_data(hostile_run, name):
    convert, _, _ = hostile_run(name)
    if name in REFUSED:
        assert convert.returncode == 1 and REFUSED[name] in convert.stderr, convert.stderr
    else:
        assert convert.returncode == 0, convert.stderr


@SHARED_RUN["values"]
def test_the_standin_saw_every_verb(hostile_run):
    """The stand-in is on the path run.sh takes: the checks above are not vacuous."""
    convert, out, calls = hostile_run("values")
    assert convert.returncode == 0, convert.stderr
    verbs = {tuple(c[:2]) for c in calls}
    for verb in ((b"build", b"--force"), (b"instance", b"start"), (b"instance", b"list")):
        assert any(v[:len(verb)] == verb for v in verbs), (verb, verbs)
    starts = [c for c in calls if c[:2] == [b"instance", b"start"]]
    # the payload reaches the instance as data: in the env file, not on the command line, except as
    # the bind target the project asked for (one argv element, no shell between)
    for call in starts:
        for flag, arg in zip(call, call[1:]):
            assert b"touch" not in arg or (flag == b"--bind" and arg.split(b":", 1)[1].startswith(b"/data")), call


@pytest.mark.parametrize("name", [pytest.param(name, marks=SHARED_RUN[name]) for name in ("values", "fields")])
def test_every_service_of_a_shared_project_was_started_in_both_rounds(hostile_run, name):
    """Where cases share a project, one service failing early must not leave the others untried:
    each one's instance was started with and without --no-eval."""
    convert, out, calls = hostile_run(name)
    assert convert.returncode == 0, convert.stderr
    instances = [s["instance"].encode() for s in json.loads((out / "plan.json").read_text())["services"]]
    started = [c for c in calls if c[:2] == [b"instance", b"start"]]
    ups = [said for said in VERB_OUTPUTS.get(str(out), []) if said[0][0] in ("up", "restart")]
    for instance in instances:
        assert sum(instance in call for call in started) >= 2, (instance, len(started), ups)


@SHARED_RUN["name-collision"]
def test_name_collisions_get_distinct_functions_files_and_instances(hostile_run):
    convert, out, _ = hostile_run("name-collision")
    assert convert.returncode == 0, convert.stderr
    plan = json.loads((out / "plan.json").read_text())
    for key in ("instance", "env_file"):
        values = [s[key] for s in plan["services"]]
        assert len(set(values)) == len(values), values
    functions = re.findall(r"^svc_(\w+)\(\)", (out / "run.sh").read_text(), re.M)
    assert len(set(functions)) == 3


# ---- a sealed output directory ------------------------------------------------------------------

SIMPLE = "services:\n  app:\n    image: busybox\n    volumes: [\"data:/v\"]\n    tmpfs: [/scratch]\nvolumes: {data: {}}\n"


def _convert(project: Path, out: Path, env=None):
    return compose2sif_forked(["convert", "--offline", "-o", str(out)], project,
                              env or {"PATH": "/usr/bin:/bin", "HOME": str(project), "PYTHONPATH": str(REPO)})


@pytest.fixture
def simple(tmp_path):
    project, victim = tmp_path / "proj", tmp_path / "victim"
    project.mkdir()
    victim.mkdir()
    (victim / ".bashrc").write_text("victim's\n")
    (project / "compose.yaml").write_text(SIMPLE)
    return project, victim


def test_convert_into_a_directory_that_is_not_ours_refuses(simple):
    project, victim = simple
    proc = _convert(project, victim)
    assert proc.returncode == 1
    _one_error_line(proc)
    assert "is not a compose2sif output directory" in proc.stderr
    assert sorted(os.listdir(victim)) == [".bashrc"] and stat.S_IMODE(victim.stat().st_mode) == 0o755


def test_links_planted_in_an_output_dir_are_replaced_not_followed(simple):
    project, victim = simple
    out = project / "out"
    assert _convert(project, out).returncode == 0
    (out / "run.sh").unlink()
    (out / "run.sh").symlink_to(victim / ".bashrc")
    (out / "hosts.names").unlink()
    (out / "hosts.names").symlink_to(victim / "hosts.names")  # a dangling one: O_CREAT would make the victim's file
    proc = _convert(project, out)
    assert proc.returncode == 0, proc.stderr
    assert (victim / ".bashrc").read_text() == "victim's\n" and not (victim / "hosts.names").exists()
    assert not (out / "run.sh").is_symlink() and (out / "run.sh").read_text().startswith("#!/usr/bin/env bash")
    # a planted directory link: refused with one line, nothing written through it
    shutil.rmtree(out / "env")
    (out / "env").symlink_to(victim)
    proc = _convert(project, out)
    assert proc.returncode == 1 and "symbolic link" in proc.stderr, proc.stderr
    _one_error_line(proc)
    assert sorted(os.listdir(victim)) == [".bashrc"]


def test_run_sh_deletes_nothing_through_a_planted_state_link(simple, tmp_path):
    project, victim = simple
    out = project / "out"
    assert _convert(project, out).returncode == 0
    (victim / "volumes").mkdir()
    (victim / "volumes" / "precious").write_text("keep\n")
    (out / "state").symlink_to(victim)
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "C2S_RUNTIME": str(STANDIN),
           "C2S_RECORD": str(tmp_path / "record")}
    for verb in (["down", "-v"], ["up", "-d"], ["ps"]):
        proc = subprocess.run([str(out / "run.sh"), *verb], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "symbolic link" in proc.stderr, (verb, proc.stderr)
    assert (victim / "volumes" / "precious").read_text() == "keep\n"
    assert sorted(os.listdir(victim)) == [".bashrc", "volumes"]


def test_rm_inside_refuses_what_resolves_outside(simple, tmp_path):
    """run/lib/core.sh's rm_inside, on its own: a link in the path's parents sends nothing outside."""
    project, victim = simple
    out = project / "out"
    assert _convert(project, out).returncode == 0
    (out / "state").mkdir()
    (out / "state" / "overlay").symlink_to(victim)
    (out / "state" / "gone").mkdir()
    script = (f'source {REPO}/run/lib/core.sh; HERE={out}; '
              f'rm_inside {out}/state/gone; rm_inside {out}/state/overlay/.bashrc')
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 1 and "outside" in proc.stderr, proc.stderr
    assert not (out / "state" / "gone").exists() and (victim / ".bashrc").exists()


# ---- fuzz: convert, then ps and down of what it wrote ----------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402

from helpers_fuzz import hostile_projects, written_project  # noqa: E402


# 20 projects a run (each is four processes); FUZZ_EXAMPLES=500 for a deeper search
@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "20")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(project=hostile_projects())
def test_convert_ps_down_of_a_hostile_project_succeed_or_fail_with_one_line(tmp_path_factory, project):
    text, dotenv, project_name = project
    work = written_project(tmp_path_factory, text, dotenv)
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8", "PYTHONPATH": str(REPO),
           "C2S_RUNTIME": str(STANDIN), "C2S_RECORD": str(work / "record")}
    project_name = (project_name or "").replace("\0", "")  # argv cannot carry a NUL
    args = ["-p", project_name] if project_name else []
    convert = compose2sif_forked([*args, "convert", "--offline", "-o", str(work / "out")], work, env, errors="replace")
    assert "Traceback" not in convert.stderr and "internal error" not in convert.stderr, convert.stderr
    if convert.returncode != 0:
        _one_error_line(convert)
        return
    for verb in (["ps"], ["ps", "--format", "json"], ["down"]):
        proc = compose2sif_forked([*args, verb[0], "-o", str(work / "out"), *verb[1:]], work, env, errors="replace")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (verb, proc.stderr)
        if verb[1:]:
            json.loads(proc.stdout)


# ---- secrets on a healthcheck's command line ---------------------------------------------------

HEALTH = """services:
  db:
    image: mysql:8
    healthcheck: {test: ["CMD", "mysqladmin", "ping", "-h", "127.0.0.1", "-ps3cret-db"]}
  cache:
    image: redis:7
    healthcheck: {test: ["CMD", "redis-cli", "-a", "s3cret-cache", "ping"]}
  shell:
    image: mysql:8
    healthcheck: {test: ["CMD-SHELL", "mysqladmin ping -ps3cret-shell || exit 1"]}
"""


def test_healthcheck_passwords_leave_the_command_line_or_are_warned_about(tmp_path):
    (tmp_path / "compose.yaml").write_text(HEALTH)
    out = tmp_path / "out"
    proc = _convert(tmp_path, out)
    assert proc.returncode == 0, proc.stderr
    runner = (out / "run.sh").read_text()
    assert "s3cret-db" not in runner and "s3cret-cache" not in runner  # the probes' argv
    assert re.search(r"S_HEALTH=\(CMD mysqladmin ping -h 127\.[0-9.]+\)", runner), runner
    assert re.search(r"S_HEALTH=\(CMD redis-cli (-h 127\.[0-9.]+ )?ping\)", runner), runner
    assert "MYSQL_PWD=s3cret-db" in (out / "env" / "db.health.env").read_text()
    assert "MYSQL_PWD" not in (out / "env" / "db.env").read_text()  # the service's own env is as written
    # redis images: the redis adapter moves it to the service's REDISCLI_AUTH already
    assert "REDISCLI_AUTH=s3cret-cache" in (out / "env" / "cache.env").read_text()
    assert stat.S_IMODE((out / "env" / "db.health.env").stat().st_mode) == 0o600
    warnings = [line for line in proc.stderr.splitlines() if "passes a password on a command line" in line]
    assert len(warnings) == 1 and "'shell'" in warnings[0], proc.stderr


@pytest.mark.parametrize("health", [["CMD-SHELL", "curl -fs http://admin:s3cret-url@127.0.0.1/ || exit 1"],
                                    ["CMD", "probe", "--password", "s3cret-word", "it's"]])
def test_a_probe_s_words_reach_the_instance_on_stdin_not_on_a_command_line(tmp_path, health):
    """health_once from run/lib, with the runtime the RECORDING STAND-IN (it records argv): the probe's
    words, a password among them, are not in the runtime's argv; the instance's sh reads them."""
    script = ('for f in run/lib/*.sh; do source "$f"; done; NSENTER=none RT="$1"; shift; '
              'S_HEALTH_TIMEOUT=5 S_ENV=/nonexistent/app.env ENV_SUFFIX="" S_INSTANCE=v-app S_WORKDIR=/w; '
              'S_HEALTH=("$@"); health_once')
    proc = subprocess.run(["bash", "-c", script, "bash", str(STANDIN), *health], cwd=REPO, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "C2S_RECORD": str(tmp_path / "record")})
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "record").read_text()
    assert "instance://v-app\0/bin/sh\0-c\0" in argv and "s3cret" not in argv, argv

"""Fuzz of `convert` (load, plan, render) on projects drawn from the Compose Specification's own schema:
each service key gets a value of the shape the schema gives it (now and then one of another shape),
with hostile strings inside, and `x-compose2sif` gets the shapes the planner reads; one project in
four is helpers_fuzz's instead (broken YAML, odd keys, a hostile .env and project name). Every project
converts or is refused with a ComposeError within CONVERT_TIMEOUT; any other exception is a crash
("internal error"), a longer convert a hang.

Secrets on command lines: half of the projects carry secrets (a password in `environment`, a
variable from `.env`, a `secrets:` file and one from the environment, a credential in a
healthcheck or a command, a Dify service whose public defaults are replaced by generated values).
A sample of the projects that convert then go through run.sh's verbs (build, up -d, ps, logs, exec,
restart, down -v) under the RECORDING STAND-IN for apptainer (tests/standins, in its running mode:
it records every argv it is given and plays instances until `down`), and no secret may be in any
recorded argv; each verb must end in time, without a shell error, and `down` must leave nothing.

Seeded and bounded in time: C2S_FUZZ_SECONDS (default 3, so the unit suite stays fast; 30 with
CI set, where the unit tests run beside the end-to-end tests, which take far longer) is the
budget, spent as consecutive Hypothesis runs with seeds 0, 1, 2, ... so a failure names the seed
that reproduces it. The 10-minute run: C2S_FUZZ_SECONDS=600 (pytest -s prints the figures).
"""
import collections
import json
import os
import re
import shlex
import signal
import string
import subprocess
import time
import zlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pytest
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from compose2sif.convert import ConvertOptions, convert
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions
from compose2sif.load.schema import SCHEMA_PATH
from helpers import REPO, STANDIN, compose2sif_forked
from helpers_fuzz import hostile_projects, live_standin_instances

with open(SCHEMA_PATH, encoding="utf-8") as _fh:
    SCHEMA = json.load(_fh)

WORD = st.text(alphabet=string.ascii_lowercase[:5] + "019._-/", min_size=1, max_size=8)
HOSTILE = st.text(alphabet=string.ascii_letters[:4] + "019 ._-/\\$${}()`'\":=,#*&!%\n\x00é", max_size=10)
STRINGS = st.one_of(WORD, HOSTILE, st.sampled_from(["/", "./x", "../x", "127.0.0.1:80:80", "8080", "1s", "--all",
                                                    "CMD", "CMD-SHELL", "{port}", "}", "{nope}", "a" * 300]))
ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), STRINGS),
                   lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(WORD, inner, max_size=3)),
                   max_leaves=6)


def _resolve(node):
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def shaped(node, depth=0):
    """A value of the shape a schema node describes (loosely: patterns and bounds are not kept,
    so that the loader's own checks are reached too), or of another shape one time in eight."""
    node = _resolve(node)
    choices = node.get("oneOf") or node.get("anyOf")
    if choices:
        return st.one_of([shaped(c, depth) for c in choices])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    types = node.get("type", ["string", "object", "array"])
    types = [types] if isinstance(types, str) else types
    options = []
    for kind in types:
        if kind == "string":
            options.append(STRINGS)
        elif kind in ("integer", "number"):
            options.append(st.integers(-2, 70000))
        elif kind == "boolean":
            options.append(st.booleans())
        elif kind == "null":
            options.append(st.none())
        elif kind == "array":
            options.append(st.lists(shaped(node.get("items", {"type": "string"}), depth + 1), max_size=3)
                           if depth < 4 else st.just([]))
        elif kind == "object":
            properties = node.get("properties") or {}
            if properties and depth < 4:
                options.append(st.fixed_dictionaries({}, optional={k: st.deferred(lambda v=v: shaped(v, depth + 1))
                                                                   for k, v in properties.items()}))
            else:
                value = (node.get("patternProperties") or {}).values()
                inner = shaped(next(iter(value)), depth + 1) if value and depth < 4 else STRINGS
                options.append(st.dictionaries(WORD, inner, max_size=3))
    shape = st.one_of(options) if options else ANY
    return st.one_of(shape, shape, shape, shape, shape, shape, shape, ANY)


SERVICE_KEYS = SCHEMA["definitions"]["service"]["properties"]
# The planner's own extension (docs/support.md): the shapes it reads, and strings where they go.
PORT_HINT = st.one_of(st.fixed_dictionaries({"env": WORD}, optional={"template": STRINGS}),
                      st.fixed_dictionaries({"flag": st.sampled_from(["--port", "-p"])}),
                      st.just({"fixed": True}), ANY)
X_COMPOSE2SIF = st.one_of(ANY, st.fixed_dictionaries({}, optional={
    "image": st.one_of(st.dictionaries(st.sampled_from(["docker", "sif", "oras", "build"]), STRINGS,
                                       max_size=1), ANY),
    "writable": st.one_of(st.lists(STRINGS, max_size=3), ANY),
    "writable_tmpfs": ANY,
    "ports": st.one_of(st.dictionaries(st.sampled_from(["80", "8080", "0", "x"]), PORT_HINT, max_size=2), ANY),
    "bind_address": PORT_HINT}))
SERVICE_NAMES = st.one_of(st.sampled_from(["app", "db", "web.1", "x_y-z", "-lead", "a" * 300]), WORD)


# an image of each adapter (compose2sif/adapters/), and Dify's own (they turn its preset on)
IMAGES = ["busybox", "nginx:1", "redis:7", "postgres:16", "mysql:8", "mongo:7", "ubuntu/squid:6",
          "semitechnologies/weaviate:1", "vllm/vllm-openai:v0.6.0", "ghcr.io/ggml-org/llama.cpp:server",
          "langgenius/dify-web:1", "langgenius/dify-sandbox:0.2", "langgenius/dify-plugin-daemon:0.1"]


@st.composite
def schema_service(draw):
    service = {"image": draw(st.sampled_from(IMAGES))}
    for key in draw(st.lists(st.sampled_from(sorted(SERVICE_KEYS)), max_size=4, unique=True)):
        service[key] = draw(shaped(SERVICE_KEYS[key]))
    if draw(st.booleans()):
        service["x-compose2sif"] = draw(X_COMPOSE2SIF)
    return service


# Secrets a project may carry, each where a user would put one; the values are unique strings no
# drawn value makes, so any of them in an argv is a leak.
SENTINEL = {place: f"c2s-secret-{place}-Zq7w" for place in
            ("env", "dotenv", "file", "secret-env", "health", "command", "dify")}
PROBES = [["CMD-SHELL", f"curl -fs http://admin:{SENTINEL['health']}@localhost/ || exit 1"],
          ["CMD", "mysqladmin", "ping", "-h", "localhost", f"-p{SENTINEL['health']}"],
          ["CMD", "redis-cli", "-a", SENTINEL["health"], "ping"],
          ["CMD", "probe", "--password", SENTINEL["health"]]]
VERBS_ONE_IN = int(os.environ.get("C2S_FUZZ_VERBS_ONE_IN", "6"))  # projects, of those that convert
DIFY = {"image": "langgenius/dify-api:1.0",
        "environment": {"SECRET_KEY": "${SECRET_KEY:-sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U}",
                        "DB_PASSWORD": "${DB_PASSWORD:-difyai123456}", "MY_API_KEY": SENTINEL["dify"]}}


@dataclass
class Drawn:
    text: str                            # compose.yaml
    dotenv: str = ""                     # .env
    secrets: List[str] = field(default_factory=list)  # the sentinels the project carries
    verbs: bool = False                  # run run.sh's verbs under the recording stand-in when it converts
    eval_runtime: bool = False           # ... as a runtime without --no-eval (Apptainer 1.0)
    project_name: Optional[str] = None   # -p


def _add_environment(service: dict, pairs: Dict[str, str]) -> None:
    environment = service.get("environment")
    if isinstance(environment, list):
        service["environment"] = environment + [f"{k}={v}" for k, v in pairs.items()]
    else:
        service["environment"] = {**(environment if isinstance(environment, dict) else {}), **pairs}


@st.composite
def schema_projects(draw):
    names = draw(st.lists(SERVICE_NAMES, min_size=1, max_size=3, unique=True))
    document = {"services": {name: draw(schema_service()) for name in names}}
    for kind in draw(st.lists(st.sampled_from(["volumes", "networks", "secrets", "configs"]), max_size=2)):
        document[kind] = draw(shaped(SCHEMA["properties"][kind]))
    drawn = Drawn("")
    carriers = draw(st.lists(st.sampled_from(["env", "file", "health", "command", "dify"]), max_size=5, unique=True))
    service = document["services"][draw(st.sampled_from(names))]
    if "env" in carriers:
        _add_environment(service, {"APP_PASSWORD": SENTINEL["env"], "API_TOKEN": "${C2S_TOKEN}"})
        drawn.dotenv += f"C2S_TOKEN={SENTINEL['dotenv']}\n"
        drawn.secrets += [SENTINEL["env"], SENTINEL["dotenv"]]
    if "file" in carriers:
        top = document.get("secrets") if isinstance(document.get("secrets"), dict) else {}
        document["secrets"] = {**top, "c2s_file": {"file": "./c2s-secret.txt"}, "c2s_env": {"environment": "C2S_S"}}
        service["secrets"] = (service["secrets"] if isinstance(service.get("secrets"), list) else []) + \
            ["c2s_file", "c2s_env"]
        drawn.dotenv += f"C2S_S={SENTINEL['secret-env']}\n"
        drawn.secrets += [SENTINEL["file"], SENTINEL["secret-env"]]
    if "health" in carriers:
        health = service.get("healthcheck") if isinstance(service.get("healthcheck"), dict) else {}
        service["healthcheck"] = {**health, "test": draw(st.sampled_from(PROBES))}
        drawn.secrets.append(SENTINEL["health"])
    if "command" in carriers:  # the service's own command: in its env file, not on the runtime's argv
        service["command"] = ["redis-server", "--requirepass", SENTINEL["command"]]
        drawn.secrets.append(SENTINEL["command"])
    if "dify" in carriers:  # the preset: its public defaults become generated secrets (secrets.env)
        document["services"]["c2s-dify"] = dict(DIFY)
        drawn.secrets.append(SENTINEL["dify"])
    drawn.text = yaml.safe_dump(document, allow_unicode=True)
    # which projects go through the verbs: a function of the text, so a shrunk or replayed example decides alike
    digest = zlib.crc32(drawn.text.encode("utf-8", "surrogateescape"))
    drawn.verbs, drawn.eval_runtime = digest % VERBS_ONE_IN == 0, digest & 0x100 != 0
    return drawn


@st.composite
def hostile_drawn(draw):
    """helpers_fuzz's hostile projects (broken YAML, odd keys, a hostile .env and project name), for convert."""
    text, dotenv, project_name = draw(hostile_projects())
    drawn = Drawn(text, dotenv, project_name=project_name or None)
    drawn.verbs = zlib.crc32(text.encode("utf-8", "surrogateescape")) % VERBS_ONE_IN == 0
    return drawn


def convert_or_refuse(work, text, dotenv="", project_name=None):
    """Convert the project in `work`; returns the ComposeError's text, or None when it converted."""
    (work / "compose.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    (work / ".env").write_text(dotenv, encoding="utf-8", errors="surrogateescape")
    (work / "nginx.conf").write_text("server { listen 80; }\n")
    (work / "c2s-secret.txt").write_text(SENTINEL["file"] + "\n")
    options = ProjectOptions(cwd=str(work), environ={"PATH": "/usr/bin:/bin", "HOME": str(work)},
                             project_name=project_name)
    signal.signal(signal.SIGALRM, _hang)
    signal.setitimer(signal.ITIMER_REAL, CONVERT_TIMEOUT)
    try:
        convert(options, ConvertOptions(output=str(work / "out"), offline=True), lambda line: None)
    except ComposeError as exc:
        message = str(exc)
        assert message and "\n" not in message, message
        return message
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return None


CONVERT_TIMEOUT = 15  # seconds; a convert takes well under one


def _hang(signum, frame):
    pytest.fail(f"convert did not end in {CONVERT_TIMEOUT}s (a hang)")


# ---- run.sh's verbs on what converted, under the recording stand-in --------------------------------

SECRET_NAME = re.compile(r"(?i)(pass|pwd|secret|token|key|auth|credential)")
SHELL_ERRORS = ("syntax error", "command not found", "unbound variable", "bad substitution", "bad array subscript",
                "integer expression expected", "invalid arithmetic", "Traceback", "internal error")
FAILED_VERBS = collections.Counter()
VERB_TIMEOUT = 60  # seconds: the stand-in answers at once, so only a hang takes this long


def secret_values(work, out, text, carried):
    """What must never be on a command line: the carried sentinels, the generated secrets
    (secrets.env), the values of secret-like variables in the services' env files, and the files
    convert wrote for `secrets:` from the environment or inline. Drawn values short or used
    elsewhere in the project (as a name or a path too) are left out: finding those on an argv is
    no leak."""
    found = set(carried)
    for env_file in [out / "secrets.env", *(out / "env").glob("*.env")]:
        if not env_file.is_file():
            continue
        for word in shlex.split(env_file.read_text(), comments=True):
            key, _, value = word.partition("=")
            if (env_file.name == "secrets.env" or SECRET_NAME.search(key)) and len(value) >= 8 \
                    and text.count(value) <= 1:
                found.add(value)
    for secret_file in (out / "config" / "secrets").glob("*"):
        value = secret_file.read_text(errors="replace").strip() if secret_file.is_file() else ""
        if len(value) >= 8 and text.count(value) <= 1:
            found.add(value)
    return found


def _stop_standin_instances(instances):
    """End the stand-in instances a failed run left, as its `instance stop` does: each init's
    children, then the init (by the pid the stand-in recorded)."""
    for record in instances.iterdir():
        pid = record.read_text().strip()
        if pid.isdigit():
            subprocess.run(["pkill", "-KILL", "-P", pid], check=False)
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def verbs_leave_no_secret_on_argv(work, text, carried, eval_runtime, seen):
    """run.sh's verbs under the recording stand-in; fails on a secret in a recorded argv, a shell
    error, a hang, or an instance left after `down -v`."""
    out, record, instances = work / "out", work / "record", work / "instances"
    instances.mkdir()
    plan = json.loads((out / "plan.json").read_text())
    for image in plan["images"].values():  # so that `up` reaches `instance start`
        (out / image["sif"]).write_text("stand-in image\n")
    names = [s["name"] for s in plan["services"]]
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(work), "LANG": "C.UTF-8",
           "C2S_RUNTIME": str(STANDIN), "C2S_RECORD": str(record), "C2S_STANDIN_INSTANCES": str(instances),
           "C2S_SIF_CACHE": str(work / "sif-cache"), "C2S_STANDIN_EVAL": "1" if eval_runtime else "0"}
    secrets = sorted(secret_values(work, out, text, carried))
    verbs = [["build", "--force"], ["up", "-d"], ["ps"], ["ps", "--format", "json"], *[["logs", n] for n in names[:1]],
             *[["exec", n, "true"] for n in names], *[["restart", n] for n in names[:1]], ["down", "-v"]]
    try:
        for verb in verbs:
            before = record.stat().st_size if record.exists() else 0
            try:
                proc = subprocess.run([str(out / "run.sh"), *verb], cwd=work, env=env, capture_output=True,
                                      text=True, errors="replace", timeout=VERB_TIMEOUT)
            except subprocess.TimeoutExpired:
                pytest.fail(f"run.sh {' '.join(verb)} did not end in {VERB_TIMEOUT}s")
            assert not any(e in proc.stderr for e in SHELL_ERRORS), (verb, proc.stderr)
            if proc.returncode != 0:
                seen["verb rc != 0"] += 1
                last = (proc.stderr.strip().splitlines() or [""])[-1]  # the why, its paths and names left out
                FAILED_VERBS[(verb[0], re.sub(r"(/\S*|for \S+|image \S+)", "…", last)[:120])] += 1
            calls = record.read_bytes()[before:].split(b"\036")[:-1] if record.exists() else []
            seen["argv recorded"] += len(calls)
            for call in calls:
                for secret in secrets:
                    assert secret.encode() not in call, \
                        f"run.sh {' '.join(verb)}: secret {secret!r} on the runtime's command line: {call!r}"
        seen["secrets checked"] += len(secrets)
        seen["projects through the verbs"] += 1
        assert not live_standin_instances(instances), "`down -v` left stand-in instances running"
    finally:
        _stop_standin_instances(instances)


def test_convert_of_schema_shaped_projects_never_crashes(tmp_path_factory):
    budget = float(os.environ.get("C2S_FUZZ_SECONDS", "30" if os.environ.get("CI") else "3"))
    seen, converted = collections.Counter(), set()

    def one_run(run_seed):
        @seed(run_seed)
        @settings(max_examples=10, deadline=None, database=None, derandomize=False,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                         HealthCheck.data_too_large, HealthCheck.filter_too_much])
        @given(drawn=st.one_of(schema_projects(), schema_projects(), schema_projects(), hostile_drawn()))
        def check(drawn):
            seen["projects"] += 1
            work = tmp_path_factory.mktemp("fuzz")
            if convert_or_refuse(work, drawn.text, drawn.dotenv, drawn.project_name) is not None:
                seen["refused"] += 1
                return
            seen["converted"] += 1
            converted.add(drawn.text)
            if drawn.verbs:
                verbs_leave_no_secret_on_argv(work, drawn.text, drawn.secrets, drawn.eval_runtime, seen)
        check()

    start, run_seed = time.monotonic(), 0
    while time.monotonic() - start < budget:
        one_run(run_seed)
        run_seed += 1
    print(f"fuzz: {seen['projects']} projects in {time.monotonic() - start:.1f}s, {run_seed} seeds, "
          f"{seen['refused']} refused with a ComposeError, {seen['converted']} converted "
          f"({len(converted)} distinct); {seen['projects through the verbs']} through run.sh's "
          f"verbs ({seen['argv recorded']} argv recorded, {seen['secrets checked']} secrets checked, "
          f"{seen['verb rc != 0']} verbs exited non-zero)")
    for (verb, line), count in FAILED_VERBS.most_common():
        print(f"  {count} x {verb}: {line}")


def test_secrets_of_every_carrier_stay_off_the_recorded_argv(tmp_path):
    """The argv check of the fuzz above on one project that carries every kind of secret: the
    stand-in saw each verb's calls, and the check looks at values that are really there."""
    document = {"services": {"app": {"image": "mysql:8", "environment": {"APP_PASSWORD": SENTINEL["env"],
                                                                         "API_TOKEN": "${C2S_TOKEN}"},
                                     "secrets": ["c2s_file", "c2s_env"], "healthcheck": {"test": PROBES[0]},
                                     "command": ["mysqld", "--password", SENTINEL["command"]]},
                             "c2s-dify": {**DIFY, "healthcheck": {"test": PROBES[3]}}},
                "secrets": {"c2s_file": {"file": "./c2s-secret.txt"}, "c2s_env": {"environment": "C2S_S"}}}
    text = yaml.safe_dump(document)
    dotenv = f"C2S_TOKEN={SENTINEL['dotenv']}\nC2S_S={SENTINEL['secret-env']}\n"
    assert convert_or_refuse(tmp_path, text, dotenv) is None
    out = tmp_path / "out"
    secrets = secret_values(tmp_path, out, text, SENTINEL.values())
    generated = (out / "secrets.env").read_text()
    assert len(secrets) > len(SENTINEL) and all(v in generated for v in secrets - set(SENTINEL.values())), secrets
    for place, value in SENTINEL.items():  # each is where the instances read it: the output directory, a bound file
        assert place == "file" or any(value in f.read_text() for f in out.rglob("*") if f.is_file()), value
    seen = collections.Counter()
    verbs_leave_no_secret_on_argv(tmp_path, text, SENTINEL.values(), False, seen)
    calls = (tmp_path / "record").read_bytes()
    for service in ("app", "c2s-dify"):
        assert b"instance\0start\0" in calls and f"instance://{tmp_path.name}-{service}\0".encode() in calls
    assert f"{tmp_path}/c2s-secret.txt:/run/secrets/c2s_file".encode() in calls
    assert seen["projects through the verbs"] == 1 and seen["argv recorded"] > 20, seen


@pytest.mark.parametrize("x_compose2sif, wording", [
    ("{writable: [1]}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("{writable: [[]]}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("{writable: /str}", "x-compose2sif.writable: must be a list of absolute paths"),
    ("x", "x-compose2sif: must be a mapping"),
    ("{image: x}", "x-compose2sif.image: must be a mapping with one of"),
    ("{ports: {'80': {env: PORT, template: '}'}}}", "x-compose2sif.ports.80.template: template '}'"),
    ("{ports: {'80': {env: PORT, template: '{nope}'}}}", "x-compose2sif.ports.80.template: template '{nope}'"),
    ("{ports: {'80': {env: PORT, template: '{port[0]}'}}}", "x-compose2sif.ports.80.template"),
])
def test_malformed_hints_are_one_located_line(tmp_path, x_compose2sif, wording):
    text = f"services:\n  app:\n    image: busybox\n    ports: ['80']\n    x-compose2sif: {x_compose2sif}\n"
    message = convert_or_refuse(tmp_path, text)
    assert message is not None and wording in message, message
    assert message.startswith(f"{tmp_path / 'compose.yaml'}:2: services.app."), message


def test_an_unreadable_or_endless_nginx_config_is_one_located_line(tmp_path):
    (tmp_path / "conf.d").mkdir()
    os.mkfifo(tmp_path / "conf.d" / "default.conf")  # reading it would block forever
    text = "services:\n  web:\n    image: nginx:1\n    volumes: ['./conf.d:/etc/nginx/conf.d']\n"
    message = convert_or_refuse(tmp_path, text)
    assert message is not None and "default.conf: mounted into nginx's configuration, but not a regular file" \
        in message and "services.web.volumes" in message, message


# ---- x-compose2sif.image: a source of the user's choosing, data all the way into a batch job -------

def _c2s(*args, cwd):
    return compose2sif_forked(list(args), cwd, {"PATH": "/usr/bin:/bin", "HOME": str(cwd), "PYTHONPATH": str(REPO)})


@pytest.mark.parametrize("source, wording", [
    ("{docker: null}", "x-compose2sif.image.docker: None: expected an image reference"),
    ("{docker: {a: 1}}", "x-compose2sif.image.docker: {'a': 1}: expected an image reference"),
    ("{sif: ''}", "x-compose2sif.image.sif: '': expected a path"),
    ("{oci-archive: [x]}", "x-compose2sif.image.oci-archive: ['x']: expected a path"),
    ("{sif: \"a\\n%setup\\n  touch x\"}", "x-compose2sif.image: contains a newline or another control character"),
    ("{sif: a.sif, docker: b}", "x-compose2sif.image: must be a mapping with one of"),
])
def test_an_image_source_that_is_no_string_is_one_located_line(tmp_path, source, wording):
    text = f"services:\n  app:\n    image: busybox\n    x-compose2sif:\n      image: {source}\n"
    message = convert_or_refuse(tmp_path, text)
    assert message is not None and f"services.app.{wording}" in message, message
    assert message.startswith(f"{tmp_path / 'compose.yaml'}:"), message


def test_a_hostile_image_source_stays_data_in_a_batch_job_and_a_planted_one_is_refused(tmp_path):
    sentinel = tmp_path / "PWNED"
    project = tmp_path / "proj"
    project.mkdir()
    (project / "compose.yaml").write_text(f"""services:
  app:
    image: busybox
    x-compose2sif: {{image: {{sif: "../x$(touch {sentinel})'.sif"}}}}
  model:
    image: busybox
    x-compose2sif: {{image: {{docker: "vllm/vllm-openai:v0.6.0; touch {sentinel}"}}}}
""")
    out = project / "out"
    proc = _c2s("convert", "--offline", "-o", str(out), cwd=project)
    assert proc.returncode == 0, proc.stderr
    plan_path = out / "plan.json"
    plan = json.loads(plan_path.read_text())
    for image in plan["images"].values():
        (out / image["sif"]).write_text("placeholder, not a SIF\n")
    job = tmp_path / "job.sh"
    proc = _c2s("batch", "--dir", str(out), "--scheduler", "slurm", "-o", str(job), cwd=project)
    assert proc.returncode == 0, proc.stderr
    header = job.read_text().split("set -uo pipefail")[0]
    sifs = subprocess.run(["bash", "-c", header + '\nprintf "%s\\n" "${sifs[@]}"'], capture_output=True, text=True,
                          check=True).stdout.split()
    assert len(sifs) == 2 and all(os.path.dirname(s) == str(out / "sif") for s in sifs), sifs
    assert not sentinel.exists()
    # a plan.json edited or planted to send the job elsewhere: one line naming the file, service and key
    for sif, ref in [("../../victim.sif", None), ("/etc/passwd", None), ("sif/../../x.sif", None),
                     (None, "x\n#SBATCH --uid=0"), (None, 7)]:
        edited = json.loads(json.dumps(plan))
        image = edited["images"][edited["services"][0]["image"]]
        image.update({k: v for k, v in (("sif", sif), ("ref", ref)) if v is not None})
        plan_path.write_text(json.dumps(edited))
        proc = _c2s("batch", "--dir", str(out), "--scheduler", "slurm", "-o", str(job), cwd=project)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert f"{plan_path}: services.app.image: image" in proc.stderr and "convert again" in proc.stderr, \
            proc.stderr
    edited = json.loads(json.dumps(plan))
    edited["services"][0]["image"] = "nope"
    plan_path.write_text(json.dumps(edited))
    proc = _c2s("batch", "--dir", str(out), "--scheduler", "slurm", "-o", str(job), cwd=project)
    assert proc.returncode == 1 and "services.app.image: 'nope' is not an image of the plan" in proc.stderr


def test_a_project_whose_services_are_all_behind_profiles_is_no_service_selected(tmp_path):
    """Found by the fuzz: `up` took the empty list of services for one service named ''."""
    assert convert_or_refuse(tmp_path, "services:\n  app:\n    image: busybox\n    profiles: [debug]\n") is None
    env = {"PATH": f"{STANDIN.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "C2S_RUNTIME": str(STANDIN),
           "C2S_RECORD": str(tmp_path / "record")}
    for verb, rc in ((["up", "-d"], 1), (["build"], 0), (["ps"], 0), (["down"], 0)):
        proc = subprocess.run([str(tmp_path / "out" / "run.sh"), *verb], env=env, capture_output=True, text=True,
                              timeout=VERB_TIMEOUT)
        assert proc.returncode == rc and "no such service" not in proc.stderr, (verb, proc.stderr)
        if verb[0] == "up":
            assert proc.stderr == "run.sh: no service selected\n", proc.stderr  # Docker Compose's words

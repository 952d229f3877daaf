"""Property-based tests: random interpolation templates and random .env files are read by
compose2sif exactly as Docker Compose reads them (the oracle binary)."""
import json
import os
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compose2sif.errors import ComposeError
from compose2sif.load.consistency import HOST_NAME
from compose2sif.load import ProjectOptions, load_project
from oracle import base_env, oracle_mark, run_oracle, unescape

pytestmark = oracle_mark()

NAMES = ["A", "B", "EMPTY", "UNSET", "lower_x", "LONG_NAME_9"]
OPERATORS = [":-", "-", ":+", "+", ":?", "?"]
TEXT = st.text(alphabet="abcXYZ019 -_:/.,}=#'\"@", max_size=6)
VALUE = st.text(alphabet="abc XYZ09-:/${}'\"#\\=", max_size=8)
# each example is a question to the oracle (about 50 ms, its start): 25 a test here, 100 in CI,
# where these run beside the end-to-end tests, which take far longer
SETTINGS = settings(max_examples=int(os.environ.get("ORACLE_EXAMPLES", "100" if os.environ.get("CI") else "25")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def templates(depth=2):
    leaf = st.one_of(
        TEXT,
        st.sampled_from(NAMES).map(lambda n: "$" + n),
        st.sampled_from(NAMES).map(lambda n: "${" + n + "}"),
        st.just("$$"),
        st.just("$$A"),
    )
    if depth == 0:
        return leaf
    braced = st.builds(lambda n, op, inner: "${" + n + op + inner + "}",
                       st.sampled_from(NAMES), st.sampled_from(OPERATORS), templates(depth - 1))
    return st.lists(st.one_of(leaf, braced), min_size=1, max_size=4).map("".join)


def environments():
    return st.fixed_dictionaries({"A": VALUE, "B": VALUE, "EMPTY": st.just(""), "lower_x": VALUE,
                                  "LONG_NAME_9": VALUE})


def ours(cwd, env):
    try:
        project = load_project(ProjectOptions(cwd=str(cwd), environ=env))
    except ComposeError as exc:
        return 1, None, str(exc)
    return 0, json.loads(json.dumps(project.config)), ""


@SETTINGS
@given(values=st.lists(templates(), min_size=1, max_size=6), env=environments())
def test_interpolation_matches_compose(tmp_path_factory, values, env):
    work = tmp_path_factory.mktemp("interp")
    lines = ["services:", "  app:", "    image: a", "    environment:"]
    lines += [f"      K{i}: {json.dumps(v)}" for i, v in enumerate(values)]
    (work / "compose.yaml").write_text("\n".join(lines) + "\n")
    full_env = base_env(env)
    rc_oracle, theirs, err = run_oracle([], work, full_env)
    rc_ours, mine, my_err = ours(work, full_env)
    assert rc_ours == rc_oracle, f"oracle rc={rc_oracle} ({err.strip()}), ours rc={rc_ours} ({my_err})"
    if rc_oracle == 0:
        assert mine["services"]["app"].get("environment") == unescape(theirs)["services"]["app"].get("environment")


def _dotenv_line(draw):
    key = draw(st.sampled_from(["K1", "K2", "K3", "K_4", "k5"]))
    form = draw(st.sampled_from(["plain", "single", "double", "export", "comment", "blank", "bare",
                                 "spaced", "trailing"]))
    plain = draw(st.text(alphabet="abc XYZ09-:/{}#=@.", max_size=8)).strip()
    ref = draw(st.sampled_from(["", "${HOSTV}", "$HOSTV", "${K1}", "${MISSING:-dflt}", "${K2:+alt}"]))
    if form == "plain":
        return key, f"{key}={plain.split(' #')[0].lstrip()}{ref}"
    if form == "spaced":
        return key, f"{key} = {plain.lstrip()}"
    if form == "trailing":
        return key, f"{key}=v{ref} # comment {plain}"
    if form == "single":
        body = draw(st.text(alphabet="abc XYZ$\\n\"#{}", max_size=8))
        return key, f"{key}='{body}'"
    if form == "double":
        body = draw(st.text(alphabet="abc XYZ09#{}'", max_size=6))
        escape = draw(st.sampled_from(["", "\\n", "\\t", "\\\"", "\\\\", "\\$", "\\x"]))
        return key, f'{key}="{body}{escape}{ref}"'
    if form == "export":
        return key, f"export {key}={plain.lstrip()}"
    if form == "comment":
        return None, f"# {plain}"
    if form == "bare":
        return "HOSTV", "HOSTV"
    return None, ""


@st.composite
def dotenv_files(draw):
    pairs = [_dotenv_line(draw) for _ in range(draw(st.integers(1, 7)))]
    return "\n".join(line for _, line in pairs) + "\n"


@SETTINGS
@given(content=dotenv_files(), hostv=VALUE)
def test_dotenv_matches_compose(tmp_path_factory, content, hostv):
    work = tmp_path_factory.mktemp("dotenv")
    (work / ".env").write_text(content)
    (work / "vars.env").write_text(content)
    keys = ["K1", "K2", "K3", "K_4", "k5", "HOSTV"]
    lines = ["services:", "  interpolated:", "    image: a", "    environment:"]
    lines += [f"      {k}: ${{{k}}}" for k in keys]
    lines += ["  from_env_file:", "    image: a", "    env_file: vars.env"]
    (work / "compose.yaml").write_text("\n".join(lines) + "\n")
    full_env = base_env({"HOSTV": hostv})
    rc_oracle, theirs, err = run_oracle([], work, full_env)
    rc_ours, mine, my_err = ours(work, full_env)
    assert rc_ours == rc_oracle, f"oracle rc={rc_oracle} ({err.strip()}), ours rc={rc_ours} ({my_err})"
    if rc_oracle == 0:
        theirs = unescape(theirs)
        for service in ("interpolated", "from_env_file"):
            assert mine["services"][service].get("environment") == theirs["services"][service].get("environment")


# Pieces of string commands: quotes, backslashes, dollars (escaped for interpolation), spaces, tabs,
# the operators that end a command for Compose, parentheses and backquotes.
COMMAND_PIECES = st.sampled_from(["a", "b1", "-c", " ", "  ", "\t", "\n", "'", '"', "\\", "\\\\", "$$", "$$!",
                                  "$$(", ")", "`", ";", "&", "|", "<", ">", "2>", "=", "#", "é"])


def command_strings():
    return st.lists(COMMAND_PIECES, min_size=1, max_size=12).map("".join)


@SETTINGS
@given(command=command_strings(), entrypoint=command_strings())
def test_string_commands_split_as_compose_splits_them(tmp_path_factory, command, entrypoint):
    work = tmp_path_factory.mktemp("split")
    lines = ["services:", "  app:", "    image: a", f"    command: {json.dumps(command)}",
             f"    entrypoint: {json.dumps(entrypoint)}", f"    healthcheck: {{test: {json.dumps(command)}}}"]
    (work / "compose.yaml").write_text("\n".join(lines) + "\n")
    env = base_env({})
    rc_oracle, theirs, err = run_oracle([], work, env)
    rc_ours, mine, my_err = ours(work, env)
    assert rc_ours == rc_oracle, f"oracle rc={rc_oracle} ({err.strip()}), ours rc={rc_ours} ({my_err})"
    if rc_oracle == 0:
        theirs = unescape(theirs)["services"]["app"]
        for key in ("command", "entrypoint", "healthcheck"):
            assert mine["services"]["app"].get(key) == theirs.get(key), key


# ---- whole projects ---------------------------------------------------------------------------

WORD = st.text(alphabet="abcxyz019_-.", min_size=1, max_size=6)
LABEL = WORD.filter(lambda w: not w.startswith("x-"))  # see oracle.DOCUMENTED_DIFFERENCES["labels.x-*"]
HOSTNAME = WORD.filter(lambda w: re.fullmatch(HOST_NAME, w))  # see oracle.DOCUMENTED_DIFFERENCES["services.*.hostname"]
SCALAR = st.one_of(WORD, st.integers(-2, 70000), st.booleans(), st.none(), st.floats(0, 10, allow_nan=False).map(
    lambda f: round(f, 2)))
PORT = st.one_of(st.integers(1, 65535), st.builds("{}:{}".format, st.integers(1, 65535), st.integers(1, 65535)),
                 st.builds("127.0.0.1:{}:{}/udp".format, st.integers(1, 65535), st.integers(1, 65535)),
                 st.builds("{}-{}".format, st.integers(1000, 1002), st.integers(1003, 1005)))
VOLUME = st.one_of(st.builds("./{}:/{}".format, WORD, WORD), st.builds("data:/{}:ro".format, WORD),
                   st.builds("/{}".format, WORD), st.builds("~/{}:/x:z".format, WORD),
                   st.fixed_dictionaries({"type": st.just("tmpfs"), "target": st.just("/t"),
                                          "tmpfs": st.fixed_dictionaries({"size": st.sampled_from(["1m", 1024])})}))
SERVICE_VALUES = {
    "command": st.one_of(st.lists(WORD, max_size=3), st.lists(WORD, min_size=1, max_size=3).map(" ".join)),
    "entrypoint": st.lists(WORD, max_size=2),
    "environment": st.one_of(st.dictionaries(st.sampled_from(["A", "B_1", "c"]), SCALAR, max_size=3),
                             st.lists(st.sampled_from(["A=1", "B", "C=", "D=x=y", "HOME"]), max_size=3, unique=True)),
    "ports": st.lists(PORT, max_size=3), "volumes": st.lists(VOLUME, max_size=3),
    "labels": st.one_of(st.dictionaries(LABEL, SCALAR, max_size=2), st.lists(LABEL, max_size=2, unique=True)),
    "extra_hosts": st.lists(st.sampled_from(["a:1.2.3.4", "b=::1", "c:host-gateway"]), max_size=3, unique=True),
    "tmpfs": st.one_of(st.just("/run"), st.lists(st.sampled_from(["/a", "/b:size=1m"]), max_size=2, unique=True)),
    "restart": st.sampled_from(["no", "always", "on-failure:3", "unless-stopped"]),
    "healthcheck": st.fixed_dictionaries({"test": st.one_of(WORD, st.just(["CMD", "true"]))},
                                         optional={"interval": st.sampled_from(["1s", "1m30s", "90s", "1h"]),
                                                   "retries": st.integers(0, 5), "disable": st.booleans()}),
    "ulimits": st.dictionaries(st.sampled_from(["nofile", "nproc"]), st.one_of(
        st.integers(1, 9999), st.fixed_dictionaries({"soft": st.integers(1, 99), "hard": st.integers(100, 999)})),
        max_size=2),
    "deploy": st.fixed_dictionaries({}, optional={"replicas": st.integers(0, 3), "resources": st.fixed_dictionaries(
        {}, optional={"limits": st.fixed_dictionaries({}, optional={"memory": st.sampled_from(["1g", "512M"]),
                                                                    "cpus": st.sampled_from(["0.5", 2])})})}),
    "shm_size": st.sampled_from(["64m", "1gb", 1024]), "working_dir": st.sampled_from(["/w", "/a/../b"]),
    "user": st.sampled_from(["1000", "1000:1000", "root"]), "init": st.booleans(), "privileged": st.booleans(),
    "stop_grace_period": st.sampled_from(["10s", "1m"]), "hostname": HOSTNAME, "read_only": st.booleans(),
    "cap_add": st.lists(st.sampled_from(["NET_ADMIN", "SYS_PTRACE"]), max_size=2, unique=True),
    "expose": st.lists(st.one_of(st.integers(1, 9999), st.just("7000-7002")), max_size=2, unique=True),
    "dns": st.one_of(st.just("8.8.8.8"), st.lists(st.just("1.1.1.1"), max_size=1)),
    "profiles": st.lists(st.sampled_from(["p1", "p2"]), min_size=1, max_size=2, unique=True),
    "networks": st.one_of(st.just(["front"]), st.just({"front": {"aliases": ["al"]}}), st.just({"front": None})),
    "logging": st.fixed_dictionaries({"driver": st.just("json-file")}, optional={"options": st.fixed_dictionaries(
        {"max-size": st.just("10m")}, optional={"max-file": st.integers(1, 5)})}),
    "devices": st.lists(st.sampled_from(["/dev/fuse", "/dev/a:/dev/b", "/dev/c:/dev/c:r"]), max_size=2, unique=True),
    "security_opt": st.lists(st.just("no-new-privileges:true"), max_size=1),
    "gpus": st.one_of(st.just("all"), st.just([{"driver": "nvidia", "count": 1}])),
    "pull_policy": st.sampled_from(["always", "missing", "build"]), "platform": st.sampled_from(["", "linux/amd64"]),
    "ipc": st.sampled_from(["host", "private", "shareable"]), "pid": st.sampled_from(["host", ""]),
    "secrets": st.one_of(st.just(["token"]), st.just([{"source": "token", "target": "t", "mode": 0o400}])),
    "configs": st.one_of(st.just(["conf"]), st.just([{"source": "conf", "target": "/etc/c", "uid": "1"}])),
    "env_file": st.one_of(st.just("vars.env"), st.just([{"path": "missing.env", "required": False}])),
    "stop_signal": st.sampled_from(["SIGTERM", "SIGINT"]), "mem_limit": st.sampled_from(["1g", "512m", 1024]),
    "sysctls": st.one_of(st.just({"net.core.somaxconn": 1024}), st.just(["net.ipv4.ip_forward=1"])),
    "build": st.one_of(st.just("."), st.fixed_dictionaries({"context": st.just(".")}, optional={
        "args": st.one_of(st.lists(st.sampled_from(["A", "B=2", "HOME"]), max_size=3, unique=True),
                          st.dictionaries(st.sampled_from(["A", "B", "HOME"]), SCALAR, max_size=2)),
        "target": st.sampled_from(["", "t"])})),
}


@st.composite
def projects(draw):
    services = {}
    for name in draw(st.lists(st.sampled_from(["app", "db", "web-1", "w.x"]), min_size=1, max_size=3, unique=True)):
        service = {"image": "busybox"}
        for key in draw(st.lists(st.sampled_from(sorted(SERVICE_VALUES)), max_size=5, unique=True)):
            service[key] = draw(SERVICE_VALUES[key])
        if draw(st.booleans()) and services:
            service["depends_on"] = draw(st.lists(st.sampled_from(sorted(services)), min_size=1, unique=True))
        services[name] = service
    return {"services": services, "volumes": {"data": {}, "spare": None},
            "networks": {"front": draw(st.sampled_from([None, {}, {"driver": "bridge", "internal": True},
                                                        {"ipam": {"config": [{"subnet": "10.1.0.0/24"}]}}]))},
            "secrets": {"token": {"file": "./token.txt"}}, "configs": {"conf": {"content": "x $$y"}}}


@SETTINGS
@given(project=projects())
def test_random_projects_match_compose_on_every_key(tmp_path_factory, project):
    from oracle import differences
    work = tmp_path_factory.mktemp("project")
    (work / "compose.yaml").write_text(json.dumps(project))  # JSON is YAML
    (work / "vars.env").write_text("V=1\nW='two words'\n")
    env = base_env({})
    rc_oracle, theirs, err = run_oracle([], work, env)
    rc_ours, mine, my_err = ours(work, env)
    assert rc_ours == rc_oracle, f"oracle rc={rc_oracle} ({err.strip()}), ours rc={rc_ours} ({my_err})"
    if rc_oracle == 0:
        problems = differences(mine, theirs)
        assert not problems, "\n".join(problems)

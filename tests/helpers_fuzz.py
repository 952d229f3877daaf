"""Hostile projects for hypothesis: compose files and .env files with shell metacharacters, NULs,
newlines and odd keys in every place, for the fuzz tests of `config` (test_names_and_fuzz.py) and
of convert, ps and down (test_hostile.py); which instances of the recording stand-in still run
(test_fuzz_convert.py)."""
import string

import yaml
from hypothesis import strategies as st

from compose2sif.support import SERVICE_KEYS

HOSTILE = st.text(alphabet=string.ascii_letters[:6] + "019 ._-/\\$${}()`'\"\n\t:=,#*&!%\x00é", max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 70000), st.floats(allow_nan=False, width=32), HOSTILE)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(HOSTILE, inner, max_size=3)), max_leaves=8)
SERVICE_NAMES = st.one_of(st.sampled_from(["app", "db", "web.1", "x_y-z"]), HOSTILE)
KEYS = st.one_of(st.sampled_from(sorted(SERVICE_KEYS)), HOSTILE, st.just("x-compose2sif"))


# Keys with the shape Compose expects and hostile strings inside: these projects mostly load, so what
# they carry reaches the later stages (typing, paths, the printed document).
WORDS = st.lists(HOSTILE, max_size=3)
PLAUSIBLE = {
    "command": st.one_of(HOSTILE, WORDS), "entrypoint": st.one_of(HOSTILE, WORDS),
    "environment": st.one_of(st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,5}", fullmatch=True), HOSTILE,
                                             max_size=3), WORDS),
    "working_dir": HOSTILE, "user": HOSTILE, "hostname": HOSTILE, "container_name": HOSTILE,
    "extra_hosts": WORDS, "labels": st.dictionaries(HOSTILE, HOSTILE, max_size=2), "tmpfs": WORDS,
    "ports": st.lists(st.one_of(HOSTILE, st.integers(-1, 70000)), max_size=2),
    "volumes": st.lists(st.builds("{}:{}".format, HOSTILE, HOSTILE), max_size=2),
    "healthcheck": st.fixed_dictionaries({"test": st.one_of(HOSTILE, WORDS)}, optional={"interval": HOSTILE}),
    "depends_on": WORDS, "profiles": WORDS, "restart": HOSTILE, "shm_size": HOSTILE, "stop_signal": HOSTILE,
    "build": st.fixed_dictionaries({"context": HOSTILE}, optional={"args": WORDS, "dockerfile": HOSTILE}),
}


@st.composite
def plausible_service(draw):
    service = {"image": draw(st.one_of(st.just("busybox"), HOSTILE))}
    for key in draw(st.lists(st.sampled_from(sorted(PLAUSIBLE)), max_size=4, unique=True)):
        service[key] = draw(PLAUSIBLE[key])
    return service


@st.composite
def hostile_projects(draw):
    services = {}
    for name in draw(st.lists(st.sampled_from(["app", "db", "web.1"]), min_size=1, max_size=3)):
        services[name] = draw(plausible_service())
    def now_and_then():  # one time in four: keeps most projects loadable, so later stages are reached
        return draw(st.integers(0, 3)) == 0

    if now_and_then():
        for name in draw(st.lists(SERVICE_NAMES, max_size=2)):
            services[name] = draw(st.dictionaries(KEYS, VALUES, max_size=5))
    document = {"services": services}
    if now_and_then():
        for kind in draw(st.lists(st.sampled_from(["volumes", "networks", "secrets", "configs", "name", "include",
                                                   "version", "x-top"]), max_size=3)):
            document[kind] = draw(VALUES)
    text = yaml.safe_dump(document, allow_unicode=True)
    if now_and_then() and now_and_then():  # break the YAML itself
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.sampled_from(["\t", ": :", "{", "[", "&a *b", "!reset", "<<: 1", "'"])) + text[cut:]
    dotenv = ""
    if now_and_then():
        dotenv = "\n".join(draw(st.lists(st.builds("{}={}".format, st.sampled_from(
            ["COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES", "COMPOSE_FILE", "A", "x"]), HOSTILE), max_size=3)))
    project_name = draw(HOSTILE) if now_and_then() else None
    return text, dotenv, project_name


def written_project(tmp_path_factory, text: str, dotenv: str):
    """A fresh directory holding a drawn project's compose.yaml and .env, bytes as drawn."""
    work = tmp_path_factory.mktemp("fuzz")
    (work / "compose.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    (work / ".env").write_text(dotenv, encoding="utf-8", errors="surrogateescape")
    return work


def live_standin_instances(instances):
    """The RECORDING STAND-IN's instances (tests/standins) whose init still runs (a zombie has ended)."""
    live = []
    for record in instances.iterdir():
        try:
            stat_line = open(f"/proc/{record.read_text().strip()}/stat").read()
        except (FileNotFoundError, ValueError):
            continue
        if stat_line.rsplit(")", 1)[1].split()[0] != "Z":
            live.append(record.name)
    return live

"""Property-based tests: random interpolation templates and random .env files are read by
compose2sif exactly as Docker Compose reads them (the oracle binary)."""
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from oracle import base_env, oracle_mark, run_oracle, unescape

pytestmark = oracle_mark()

NAMES = ["A", "B", "EMPTY", "UNSET", "lower_x", "LONG_NAME_9"]
OPERATORS = [":-", "-", ":+", "+", ":?", "?"]
TEXT = st.text(alphabet="abcXYZ019 -_:/.,}=#'\"@", max_size=6)
VALUE = st.text(alphabet="abc XYZ09-:/${}'\"#\\=", max_size=8)
SETTINGS = settings(max_examples=int(os.environ.get("ORACLE_EXAMPLES", "40")), deadline=None,
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

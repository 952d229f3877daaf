"""Dockerfile -> definition: order of COPY and RUN, WORKDIR-relative destinations, multi-stage,
ARG and build args, exec-form quoting, USER not turned into su."""
import json
import shlex
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from compose2sif.errors import ComposeError
from compose2sif.plan.dockerfile import convert

DOCKERFILE = """\
# syntax=docker/dockerfile:1
ARG PYTHON=3.11
FROM python:${PYTHON}-slim AS builder
ARG EXTRAS=none
WORKDIR /src
COPY requirements.txt .
RUN pip wheel -r requirements.txt -w /wheels && \\
    echo "extras: $EXTRAS"
COPY app/ ./app/

FROM python:${PYTHON}-slim
ENV APP_HOME=/srv/app PYTHONUNBUFFERED=1
WORKDIR $APP_HOME
COPY --from=builder /wheels /wheels
RUN pip install /wheels/*.whl
COPY --from=builder /src/app ./
USER 1000:1000
EXPOSE 8000/tcp 9000
ENTRYPOINT ["python", "-m", "app"]
CMD ["--port", "8000", "--name", "it's here"]
"""


def test_multistage_order_workdir_args(tmp_path):
    (tmp_path / "requirements.txt").write_text("flask\n")
    (tmp_path / "app").mkdir()
    result = convert(DOCKERFILE, str(tmp_path), {"PYTHON": "3.12", "EXTRAS": "gpu"}, None, "Dockerfile")
    text = result.definition
    assert text.count("Bootstrap: docker") == 2
    assert "From: python:3.12-slim\nStage: builder" in text and "From: python:3.12-slim\nStage: stage1" in text
    builder, final = text.split("Stage: stage1")
    assert f"{tmp_path}/requirements.txt /.c2s-build/1/requirements.txt" in builder
    assert "export EXTRAS=gpu" in builder
    # COPY happens before the RUN that needs it, after the WORKDIR it is relative to
    post = builder.split("%post")[1]
    assert post.index("mkdir -p /src && cd /src") < post.index("else cp -a /.c2s-build/1/requirements.txt /src/") \
        < post.index("pip wheel")
    assert "%files from builder\n    /wheels /.c2s-build/3/wheels\n    /src/app /.c2s-build/4/app" in final
    final_post = final.split("%post")[1]
    assert final_post.index("cp -a /.c2s-build/3/wheels/. /wheels/") < final_post.index("pip install")
    assert "mkdir -p /srv/app && cd /srv/app" in final_post
    assert "cp -a /.c2s-build/4/app/. /srv/app/" in final_post
    assert "su " not in text and result.user == "1000:1000"
    assert result.workdir == "/srv/app" and result.exposed == [8000, 9000]
    runscript = final.split("%runscript")[1]
    assert 'if [ "$#" -gt 0 ]; then exec python -m app "$@"; fi' in runscript
    assert "exec python -m app --port 8000 --name 'it'\"'\"'s here'" in runscript
    assert "export APP_HOME=/srv/app" in final.split("%environment")[1]


def test_shell_forms_and_target(tmp_path):
    text = convert("FROM alpine AS a\nCMD echo $HOME\nFROM alpine AS b\nENTRYPOINT exec top -b\n",
                   str(tmp_path), {}, "a", "Dockerfile").definition
    assert "Stage: b" not in text
    assert "exec /.singularity.d/c2s-base-runscript /bin/sh -c 'echo $HOME'" in text
    text = convert("FROM alpine\nENTRYPOINT exec top -b\nCMD ignored\n", str(tmp_path), {}, None, "D").definition
    assert "exec /bin/sh -c 'exec top -b'" in text and "ignored" not in text.split("%runscript")[1]


@pytest.mark.parametrize("dockerfile,message", [
    ("RUN echo\n", "before FROM"),
    ("FROM alpine\nFROBNICATE x\n", "unknown Dockerfile instruction FROBNICATE"),
    ("FROM alpine\nCOPY ../secret /x\n", "outside the build context"),
    ("FROM alpine AS a\n", None),
])
def test_bad_dockerfiles(tmp_path, dockerfile, message):
    if message is None:
        with pytest.raises(ComposeError, match="not a stage"):
            convert(dockerfile, str(tmp_path), {}, "nope", "Dockerfile")
        return
    with pytest.raises(ComposeError, match=message):
        convert(dockerfile, str(tmp_path), {}, None, "Dockerfile")


# Apptainer's reading of a definition (pkg/build/types/parser/deffile.go): a line whose first word
# (Go's unicode white space) starts with "%" opens a section; a line starting "bootstrap:" opens a stage.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
            "\u2028\u2029\u202f\u205f\u3000"


def apptainer_sections(definition):
    sections, stages = [], 0
    for line in definition.split("\n"):
        words = line.strip(_GO_SPACE).split()
        if words and line.lstrip(_GO_SPACE)[:1] == "%":
            sections.append(line.strip())
        if line.lower().startswith("bootstrap:"):
            stages += 1
    return sections, stages


HOSTILE = ["%setup", "x\n%setup\ntouch /tmp/PWNED", "\xa0%setup", "a\nBootstrap: docker", "x\r\n%pre",
           "{{ HOME }} {{\nX}}"]


@pytest.mark.parametrize("value", HOSTILE)
def test_no_value_opens_a_section_or_a_stage(tmp_path, value):
    encoded, line = json.dumps(value), shlex.quote(value.replace("\n", " "))  # a Dockerfile line has no newline
    (tmp_path / "f").write_text("x")
    dockerfile = "\n".join([
        "FROM alpine",
        f"RUN [{encoded}, {encoded}]",
        "RUN %setup",
        f"ENV A={line}",
        f"ARG B={line}",
        f"WORKDIR /w/{line}",
        f"COPY f /d/{line}",
        f"LABEL %setup=1 ok={line}",
        f"ENTRYPOINT [{encoded}]",
        f"CMD [{encoded}]",
    ]) + "\n"
    result = convert(dockerfile, str(tmp_path), {"B": value}, None, "Dockerfile")
    sections, stages = apptainer_sections(result.definition)
    assert sections == ["%files", "%post", "%environment", "%labels", "%runscript"]
    assert stages == 1
    assert any("LABEL '%setup' is not kept" in w for w in result.warnings)
    if "{{" in value:  # Apptainer would take it for a build argument: only in the label and raw RUN text
        assert "{{" not in result.definition


@pytest.mark.parametrize("value", HOSTILE)
def test_values_reach_the_shell_exactly(tmp_path, value):
    dockerfile = f'FROM alpine\nARG B\nRUN ["printf", "%s|", {json.dumps(value)}]\nRUN printf %s "$B"\n'
    text = convert(dockerfile, str(tmp_path), {"B": value}, None, "D").definition
    post = text.split("%post\n")[1].split("\n    rm -rf")[0].split("\n", 1)[1]  # without the staging mkdir
    assert subprocess.run(["sh", "-c", post], capture_output=True).stdout.decode() == f"{value}|{value}"


@pytest.mark.parametrize("dockerfile,message", [
    ("FROM\n", "line 1: FROM needs an image"),
    ("FROM alpine\nENV\n", "line 2: ENV needs KEY=value"),
    ("FROM alpine\nLABEL\n", "line 2: LABEL needs KEY=value"),
    ("FROM alpine\nENV A\n", "line 2: ENV A has no value"),
    ("FROM alpine\nENV A=\"unbalanced\n", "line 2: cannot split"),
    ("FROM alpine\nCOPY 'a /b\n", "line 2: cannot split"),
    ("FROM alpine\nARG\n", "line 2: ARG needs a name"),
    ("FROM alpine AS\n", "line 1: expected FROM IMAGE"),
    ("FROM alpine\nRUN <<EOF\necho\n", "line 2: the heredoc <<EOF never ends"),
    ("FROM alpine\nSHELL bash\n", "line 2: SHELL needs the JSON form"),
    ("ARG BASE\nFROM ${BASE}\n", "line 2: FROM ${BASE} expands to '': ARG BASE has no value"),
    ("ARG TAG\nFROM python:$TAG\n", "ARG TAG has no value"),
    ("FROM scratch\n", "FROM scratch"),
])
def test_malformed_dockerfiles_give_one_line(tmp_path, dockerfile, message):
    with pytest.raises(ComposeError) as info:
        convert(dockerfile, str(tmp_path), {}, None, "/p/Dockerfile")
    assert message in str(info.value) and "/p/Dockerfile" in str(info.value) and "\n" not in str(info.value)


def test_a_trailing_backslash_ends_the_instruction(tmp_path):
    text = convert("FROM alpine\nRUN echo a \\\n", str(tmp_path), {}, None, "D").definition
    assert "    echo a\n" in text


def test_nested_arg_defaults_are_expanded(tmp_path):
    dockerfile = ("ARG REGISTRY=docker.io\nARG IMAGE=${REGISTRY}/library/python\nARG TAG=3.11\n"
                  "ARG BASE=${IMAGE}:${TAG}-slim\nFROM ${BASE}\nARG TAG\nARG FULL=v${TAG}-${EXTRA:-none}\n")
    text = convert(dockerfile, str(tmp_path), {"TAG": "3.12"}, None, "D").definition
    assert "From: docker.io/library/python:3.12-slim\n" in text
    assert "export TAG=3.12\n" in text and "export FULL=v3.12-none\n" in text
    # a build arg is taken literally, not expanded
    text = convert(dockerfile, str(tmp_path), {"BASE": "alpine", "TAG": "${X}"}, None, "D").definition
    assert "From: alpine\n" in text and "export TAG='${X}'" in text


def test_the_base_images_entrypoint_and_cmd_apply_without_the_dockerfiles_own(tmp_path):
    """As Docker: without an ENTRYPOINT of its own the base image's applies, and without a CMD too
    its CMD: the runscript Apptainer derives from the base's configuration, saved in %post, runs
    with this CMD or the arguments, told not to evaluate them; an ENTRYPOINT of its own drops the
    base's CMD."""
    saved = "\n    cp /.singularity.d/runscript /.singularity.d/c2s-base-runscript "
    plain = convert("FROM nginx:1.27 AS a\nRUN true\nFROM a\n", str(tmp_path), {}, None, "D").definition
    post, runscript = plain.split("%post")[1].split("%runscript")
    assert post.startswith(saved) and "exec /bin/sh" not in plain
    assert runscript.splitlines()[2:4] == [
        '    if [ "$#" -gt 0 ]; then SINGULARITY_NO_EVAL=1 exec /.singularity.d/c2s-base-runscript "$@"; fi',
        "    SINGULARITY_NO_EVAL=1 exec /.singularity.d/c2s-base-runscript"]
    cmd_only = convert('FROM nginx:1.27\nCMD ["nginx", "-g", "daemon off;"]\n', str(tmp_path), {}, None, "D").definition
    post, runscript = cmd_only.split("%post")[1].split("%runscript")
    assert post.startswith(saved)
    assert runscript.splitlines()[3] == \
        "    SINGULARITY_NO_EVAL=1 exec /.singularity.d/c2s-base-runscript nginx -g 'daemon off;'"
    inherited = convert("FROM alpine AS a\nCMD top\nFROM a\nRUN true\n", str(tmp_path), {}, None, "D").definition
    assert "exec /.singularity.d/c2s-base-runscript /bin/sh -c top" in inherited
    own = convert('FROM nginx:1.27\nENTRYPOINT ["/run.sh"]\n', str(tmp_path), {}, None, "D").definition
    assert "c2s-base-runscript" not in own and own.rstrip().endswith("exec /run.sh")


def test_shell_heredoc_and_copy_heredoc(tmp_path):
    dockerfile = ('FROM debian\nSHELL ["/bin/bash", "-o", "pipefail", "-c"]\nRUN echo $((1+1)) | cat\n'
                  "RUN <<EOF\nset -e\n%not-a-section\nEOF\nCOPY <<EOT /etc/app.conf\nkey=1\nEOT\nCMD echo hi\n")
    text = convert(dockerfile, str(tmp_path), {}, None, "D").definition
    assert "/bin/bash -o pipefail -c 'echo $((1+1)) | cat'" in text
    assert apptainer_sections(text)[0] == ["%post", "%runscript"]
    assert "c2s-base-runscript /bin/bash -o pipefail -c 'echo hi'" in text
    assert "printf %s key=1\"\n\"'' > /etc/app.conf" in text


def test_copy_from_an_image_becomes_a_stage(tmp_path):
    dockerfile = ("FROM alpine AS a\nFROM debian\nCOPY --from=ghcr.io/astral-sh/uv:0.7 /uv /bin/\n"
                  "COPY --from=0 /etc/os-release /a-release\nCOPY --from=ghcr.io/astral-sh/uv:0.7 /uvx /bin/\n")
    text = convert(dockerfile, str(tmp_path), {}, None, "D").definition
    assert text.count("From: ghcr.io/astral-sh/uv:0.7\nStage: c2s_image_2\n") == 1
    assert text.index("Stage: c2s_image_2") < text.index("Stage: stage1")
    assert "%files from c2s_image_2\n    /uv /.c2s-build/1/uv\n    /uvx /.c2s-build/3/uvx" in text
    assert "%files from a\n    /etc/os-release" in text
    assert "Stage: c2s_image_2\n\nBootstrap:" in text  # no %post: the image may have no shell


_WORDS = ["FROM alpine", "FROM", "AS x", "ARG A", "ARG A=${B:-x}", "ENV", "ENV A=", "LABEL", "RUN", "COPY",
          "COPY --from=0", "ADD", "WORKDIR", "CMD", "ENTRYPOINT", "SHELL", "USER", "EXPOSE", "<<EOF", "EOF",
          "%setup", "\n", "\r\n", " ", "\\", "'", '"', "$A", "${A}", "[", "]", '["a"', "\x00", "\xa0", "é", "{{ x }}",
          "#", "=", ".", "/", "x"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(_WORDS), max_size=40), st.text(max_size=8))
def test_random_dockerfiles_convert_or_fail_with_one_line(tmp_path, words, build_arg):
    """Any text: a definition whose only sections are ours, or one ComposeError line; never a crash."""
    try:
        result = convert("FROM alpine\n" + "".join(words), str(tmp_path), {"A": build_arg}, None, "Dockerfile")
    except ComposeError as exc:
        assert "\n" not in str(exc)
        return
    sections, stages = apptainer_sections(result.definition)
    assert set(sections) <= {"%files", "%post", "%environment", "%labels", "%runscript"} | {
        s for s in sections if s.startswith("%files from ")}
    assert stages == result.definition.count("\nStage: ") + result.definition.startswith("Stage: ")
    assert sections.count("%runscript") == 1


def test_paths_with_spaces_are_quoted_for_files_and_quotes_refused(tmp_path):
    text = convert('FROM alpine\nCOPY ["my file", "/x/"]\n', str(tmp_path), {}, None, "D").definition
    assert f'    "{tmp_path}/my file" "/.c2s-build/1/my file"\n' in text
    assert "cp -a '/.c2s-build/1/my file' /x/" in text
    with pytest.raises(ComposeError, match="D: line 2: the path .* cannot be staged"):
        convert('FROM alpine\nCOPY ["a\\"b", "/x/"]\n', str(tmp_path), {}, None, "D")

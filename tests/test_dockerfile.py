"""Dockerfile -> definition: order of COPY and RUN, WORKDIR-relative destinations, multi-stage,
ARG and build args, exec-form quoting, USER not turned into su."""
import pytest

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
    assert "exec /bin/sh -c 'echo $HOME'" in text
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

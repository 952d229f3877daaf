"""Registry mirrors per registry (compose2sif/plan/mirrors.py): the reference each image is pulled by,
in the definitions, a Dockerfile's FROM, plan.json, run.sh's builds (`--nohttps` for a plain-HTTP
mirror) and its digest checks (over HTTP to such a mirror), and one line for a bad entry."""
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from compose2sif.errors import ComposeError
from compose2sif.plan.mirrors import Mirrors, split_registry
from helpers import ENGINE_MARKER, compose2sif_forked, recorded_calls, run_lib

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standins" / "recording-standin-apptainer"


@pytest.mark.parametrize("image, registry, path", [
    ("postgres", "docker.io", "library/postgres"),
    ("postgres:16", "docker.io", "library/postgres:16"),
    ("docker.io/library/postgres:16", "docker.io", "library/postgres:16"),
    ("index.docker.io/bitnami/redis:7", "docker.io", "bitnami/redis:7"),
    ("langgenius/dify-api:1.17.1", "docker.io", "langgenius/dify-api:1.17.1"),
    ("ghcr.io/open-webui/open-webui:main", "ghcr.io", "open-webui/open-webui:main"),
    ("localhost:5000/app@sha256:" + "a" * 64, "localhost:5000", "app@sha256:" + "a" * 64),
    ("localhost/app", "localhost", "app"),
    ("quay.io/minio/minio", "quay.io", "minio/minio"),
])
def test_the_registry_of_a_reference_is_read_as_docker_reads_it(image, registry, path):
    assert split_registry(image) == (registry, path)


def test_each_registry_is_pulled_through_its_own_mirror_and_others_are_left_alone():
    mirrors = Mirrors.parse(["hub.site.example", "ghcr.io=https://cache.site.example:8443/ghcr.io/",
                             "QUAY.IO=http://10.0.0.5:5000"])
    assert mirrors.reference("postgres:16") == "hub.site.example/library/postgres:16"
    assert mirrors.reference("docker.io/langgenius/dify-web:1.17.1") == "hub.site.example/langgenius/dify-web:1.17.1"
    assert mirrors.reference("ghcr.io/x/y:1") == "cache.site.example:8443/ghcr.io/x/y:1"
    assert mirrors.reference("quay.io/minio/minio:latest") == "10.0.0.5:5000/minio/minio:latest"
    assert mirrors.reference("docker.elastic.co/elasticsearch/elasticsearch:8") == \
        "docker.elastic.co/elasticsearch/elasticsearch:8"  # no mirror for it: as written
    assert mirrors.plain_hosts() == ["10.0.0.5:5000"]
    assert Mirrors().reference("postgres:16") == "postgres:16" and not Mirrors()


def test_the_command_line_wins_over_the_environment_for_the_same_registry():
    mirrors = Mirrors.parse(["ghcr.io=cli.example/ghcr"], "ghcr.io=env.example/ghcr, env-hub.example ,,")
    assert mirrors.reference("ghcr.io/a/b") == "cli.example/ghcr/a/b"
    assert mirrors.reference("redis:7") == "env-hub.example/library/redis:7"
    assert [m["registry"] for m in mirrors.to_json()] == ["docker.io", "ghcr.io"]


@pytest.mark.parametrize("entry", ["", "ghcr.io=", "=mirror.example", "ftp://mirror.example", "mirror.example/A B",
                                   "mirror example", "ghcr.io=mirror.example:port", "a=b=c", "mirror.example/../x",
                                   "mirror.example/$(id)", "-mirror.example"])
def test_a_bad_entry_is_refused_in_one_line_naming_it(entry):
    with pytest.raises(ComposeError) as err:
        Mirrors.parse([entry])
    assert str(err.value).startswith(f"--registry-mirror {entry!r}: expected [REGISTRY=]") and \
        "\n" not in str(err.value)
    with pytest.raises(ComposeError, match="^C2S_REGISTRY_MIRRORS 'x y': expected"):
        Mirrors.parse([], "x y")


class _Registry(http.server.BaseHTTPRequestHandler):
    """A STAND-IN for a registry mirror reached through an HTTP proxy: it answers a manifest HEAD
    with a digest and records the URL asked (a proxy gets the absolute URL, scheme included)."""
    asked: list = []

    def do_HEAD(self):
        self.asked.append(self.path)
        self.send_response(200)
        self.send_header("Docker-Content-Digest", "sha256:" + "b" * 64)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def converted(tmp_path):
    """A project with images of three registries and a build FROM a fourth's, converted with a
    plain-HTTP Docker Hub mirror, an HTTPS ghcr.io one (from the environment) and none for quay.io."""
    proj = tmp_path / "proj"
    (proj / "app").mkdir(parents=True)
    (proj / "app" / "Dockerfile").write_text("FROM ghcr.io/astral-sh/uv:0.12 AS uv\nFROM python:3.12-slim\n"
                                             "COPY --from=uv /uv /usr/local/bin/uv\n")
    (proj / "compose.yaml").write_text(
        "services:\n  db: {image: 'postgres:16'}\n  ui: {image: 'ghcr.io/open-webui/open-webui:main'}\n"
        "  s3: {image: 'quay.io/minio/minio:latest'}\n  app: {build: ./app}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
           "C2S_REGISTRY_MIRRORS": "ghcr.io=cache.site.example/ghcr.io"}
    proc = compose2sif_forked(["convert", "--offline", "--registry-mirror", "http://hub.site.example:5000",
                               "-o", str(tmp_path / "out")], proj, env)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    text = (out / "run.sh").read_text()
    (out / "header.sh").write_text(text[:text.index(ENGINE_MARKER)])
    return out


def _from_lines(out: Path):
    return sorted(line.split(":", 1)[1].strip() for d in (out / "definitions").glob("*.def")
                  for line in d.read_text().splitlines() if line.startswith("From:"))


def test_definitions_plan_and_run_sh_name_each_images_mirror(converted):
    assert _from_lines(converted) == [
        "cache.site.example/ghcr.io/astral-sh/uv:0.12", "cache.site.example/ghcr.io/open-webui/open-webui:main",
        "hub.site.example:5000/library/postgres:16", "hub.site.example:5000/library/python:3.12-slim",
        "quay.io/minio/minio:latest"]
    assert json.loads((converted / "plan.json").read_text())["registry_mirrors"] == [
        {"registry": "docker.io", "mirror": "hub.site.example:5000", "plain_http": True},
        {"registry": "ghcr.io", "mirror": "cache.site.example/ghcr.io", "plain_http": False}]
    assert "PLAIN_REGISTRIES=(hub.site.example:5000)" in (converted / "header.sh").read_text()


def test_builds_from_a_plain_http_mirror_alone_get_nohttps(converted, tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "C2S_RUNTIME": str(STANDIN),
           "C2S_RECORD": str(tmp_path / "record"), "C2S_STORAGE": str(tmp_path / "storage")}
    subprocess.run([str(converted / "run.sh"), "build"], env=env, capture_output=True, text=True, timeout=120)
    builds = {c[-1]: c for c in recorded_calls(tmp_path) if c[:1] == ["build"]}
    plain = {s for s, c in builds.items() if "--nohttps" in c}
    assert plain == {"docker://hub.site.example:5000/library/postgres:16",
                     str(converted / "definitions" / "build-app.def")}, builds
    assert "docker://quay.io/minio/minio:latest" in builds and "docker://cache.site.example/ghcr.io/open-webui/" \
        "open-webui:main" in builds  # asked, over HTTPS


def test_a_digest_is_read_over_http_from_a_plain_mirror_alone(converted, tmp_path):
    _Registry.asked = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        said = run_lib(tmp_path, 'tag_digest hub.site.example:5000/library/postgres:16; echo "|"; '
                                 'tag_digest cache.site.example/ghcr.io/x/y:1', http_proxy=proxy,
                       no_proxy="", NO_PROXY="")
    finally:
        server.shutdown()
    assert said.stdout.split("|")[0].strip() == "sha256:" + "b" * 64, said
    assert said.stdout.split("|")[1].strip() == ""  # https: never sent to the HTTP proxy, unanswered here
    assert _Registry.asked == ["http://hub.site.example:5000/v2/library/postgres/manifests/16"]


def test_a_bad_mirror_is_one_line_and_a_failing_exit(tmp_path):
    (tmp_path / "compose.yaml").write_text("services:\n  db: {image: 'postgres:16'}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = compose2sif_forked(["convert", "--offline", "--registry-mirror", "ghcr.io=", "-o", "out"], tmp_path, env)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--registry-mirror 'ghcr.io=': expected [REGISTRY=]" in proc.stderr
    assert not (tmp_path / "out").exists()
    proc = compose2sif_forked(["convert", "--offline", "-o", "out"], tmp_path,
                              {**env, "C2S_REGISTRY_MIRRORS": "ghcr.io=a b"})
    assert proc.returncode != 0 and "C2S_REGISTRY_MIRRORS 'ghcr.io=a b'" in proc.stderr, proc.stderr
    assert "out" not in os.listdir(tmp_path)

"""Definition safety on a real Apptainer 1.4.5: a Dockerfile whose lines would open a %setup
section (run on the host by `apptainer build`) builds with every line in the container."""
import json
import os
import re
import subprocess

import pytest

pytestmark = pytest.mark.e2e


def test_hostile_dockerfile_runs_nothing_on_the_host(node):
    node.copy_stack("hostile-build", source="hostile-build")
    node.run("cd ~ && rm -rf hostile-out c2s-pwned-by-*")
    node.c2s(f"-f hostile-build/compose.yaml convert --registry-mirror {node.registry} -o hostile-out",
             timeout=300, check=True)
    proc = node.run("cd ~ && C2S_FORCE_BUILD=1 hostile-out/run.sh build", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # %setup would have run these as hpc on the node, with its $HOME
    assert not list(node.home.glob("c2s-pwned-by-*"))
    sif = next((node.home / "hostile-out" / "sif").glob("*.sif")).name
    out = node.run(f"apptainer exec ~/hostile-out/sif/{sif} sh -c 'ls /root; echo $NOTE $TEMPLATE'", check=True).stdout.split()
    # the lines ran in %post, in the container (fakeroot's $HOME is /root); the values kept exactly,
    # {{ HOME }} not taken for an Apptainer build argument
    assert out == ["c2s-pwned-by-exec-form", "c2s-pwned-by-shell-form", "%setup", "{{", "HOME", "}}"]


def _push(node, image: str, tag: str) -> None:
    """Put a test image in the local registry under another name, as a new push of a tag would."""
    subprocess.run(["skopeo", "copy", "-q", "--src-tls-verify=false", "--dest-tls-verify=false",
                    f"docker://{node.registry}/c2s/{image}:test", f"docker://{node.registry}/{tag}"],
                   check=True, capture_output=True, timeout=300)


def _home_caches(node):
    return [str(p) for d in (node.home / ".cache", node.home / ".apptainer" / "cache") if d.exists()
            for p in d.rglob("*")]


def _one_image_stack(node, name: str, service: str) -> str:
    """~/NAME-stack/compose.yaml with the one service given (YAML from its name on), converted
    afresh to ~/NAME-out; the key of its image."""
    stack = node.home / f"{name}-stack"
    stack.mkdir(exist_ok=True)
    (stack / "compose.yaml").write_text(f"name: {name}\nservices:\n  {service}\n")
    os.chown(stack, int(node.uid), int(node.uid))
    node.run(f"cd ~ && rm -rf {name}-out", check=True)
    node.c2s(f"-f {name}-stack/compose.yaml convert --offline -o {name}-out", check=True, timeout=300)
    return next(iter(json.loads((node.home / f"{name}-out" / "plan.json").read_text())["images"]))


def test_build_progress_storage_off_home_and_pull_of_a_moved_tag(node):
    """`build` prints a plain line per image state when stderr is no terminal; SIFs, the runtime's
    layer cache and the build space go to the scratch directory, nothing to ~/.cache or
    ~/.apptainer/cache; `build` keeps the digest it pulled, so that `build --pull` and `pull` build again an image whose tag
moved, and only then."""
    tag = "c2s/moving:test"
    _push(node, "redis", tag)
    node.run("cd ~ && rm -rf .cache .apptainer/cache /scratch/hpc/compose2sif", check=True)
    key = _one_image_stack(node, "moving", f"kv:\n    image: {node.registry}/{tag}")

    proc = node.run("cd ~ && moving-out/run.sh build", timeout=900)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("[moving] ")]
    assert lines == ["[moving] storage: SIFs and build caches go to /scratch/hpc/compose2sif (a scratch or work "
                     "directory outside $HOME; C2S_STORAGE moves them)",
                     f"[moving] image {key}: building", f"[moving] image {key}: built"], proc.stderr
    assert "\033[" not in proc.stderr  # no terminal: no redrawn block
    assert _home_caches(node) == []
    store = node.scratch / "compose2sif"
    assert (node.home / "moving-out" / "state" / "storage").read_text() == "/scratch/hpc/compose2sif\n"
    assert list((store / "sif").glob("*.sif")) and list((store / "cache").rglob("*")), "the layer cache is there"
    sif = node.home / "moving-out" / "sif" / f"{key}.sif"
    assert sif.stat().st_ino == next((store / "sif").glob("*.sif")).stat().st_ino  # a link, not a copy

    # the build kept the digest it pulled: `pull`, `build --pull` (also through compose2sif) build nothing
    first = sif.stat().st_ino
    assert (node.home / "moving-out" / "sif" / f"{key}.sif.source").read_text().startswith(f"{node.registry}/{tag}@sha256:")
    for command in ("moving-out/run.sh pull", "moving-out/run.sh build --pull"):
        proc = node.run(f"cd ~ && {command}", timeout=600)
        assert proc.returncode == 0 and f"image {key}: up to date" in proc.stderr, proc.stderr
        assert "building" not in proc.stderr and "no digest kept" not in proc.stderr
    proc = node.c2s("-f moving-stack/compose.yaml build --pull -o moving-out", timeout=900)
    assert proc.returncode == 0 and f"image {key}: up to date" in proc.stderr, proc.stderr
    assert sif.stat().st_ino == first

    _push(node, "squid", tag)  # the tag moves to another image
    proc = node.run("cd ~ && moving-out/run.sh pull", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"image {key}: {re.escape(node.registry)}/c2s/moving:test moved: \S+@sha256:\w+ -> sha256:\w+",
                     proc.stderr), proc.stderr
    assert f"image {key}: built" in proc.stderr and sif.stat().st_ino != first
    out = node.run(f"apptainer exec ~/moving-out/sif/{key}.sif sh -c 'command -v squid'", check=True).stdout
    assert out.strip().endswith("squid")  # the new image, not the old one
    assert _home_caches(node) == []


def test_failed_build_names_its_log(node):
    key = _one_image_stack(node, "broken", f"gone:\n    image: {node.registry}/c2s/absent:test")
    proc = node.run("cd ~ && broken-out/run.sh build", timeout=600)
    assert proc.returncode == 1
    log = f"/home/hpc/broken-out/state/logs/build-{key}.log"
    assert f"[broken] image {key}: failed (log: {log})" in proc.stderr, proc.stderr
    assert f"[broken] image {key}: build failed; retrying alone" in proc.stderr
    assert f"run.sh: building image {key} failed; last lines of {log}:" in proc.stderr


def test_an_image_built_from_another_services_image(node):
    """b's Dockerfile is FROM the image a builds: `run.sh build` (started from another directory)
    builds a, then b from a's SIF, which has a's file and its own; a changed a rebuilds both; a failed a
    leaves b unbuilt, saying why."""
    stack = node.copy_stack("local-base-stack", source="local-base-stack")
    node.run("cd ~ && rm -rf localbase-out /scratch/hpc/localbase-store", check=True)  # its own SIF cache
    node.c2s(f"-f local-base-stack/compose.yaml convert --registry-mirror {node.registry} -o localbase-out",
             timeout=300, check=True)

    build_sh = "C2S_STORAGE=/scratch/hpc/localbase-store ~/localbase-out/run.sh build"

    def build():
        proc = node.run(f"cd / && {build_sh}", timeout=900)
        assert proc.returncode == 0, proc.stderr
        return [line for line in proc.stderr.splitlines() if line.startswith("[localbase] image ")]

    lines = build()
    assert lines.index("[localbase] image localbase-a: built") < \
        lines.index("[localbase] image localbase-b: building --fakeroot"), lines
    assert "[localbase] image localbase-b: built" in lines
    files = "apptainer exec ~/localbase-out/sif/localbase-b.sif cat /a.txt /b.txt"
    assert node.run(files, check=True).stdout.split() == ["a1", "b"]
    assert build() == ["[localbase] image localbase-a: up to date", "[localbase] image localbase-b: up to date"]

    (stack / "a" / "Dockerfile").write_text("FROM c2s/python:test\nRUN echo a2 > /a.txt\n")
    node.c2s(f"-f local-base-stack/compose.yaml convert --registry-mirror {node.registry} -o localbase-out",
             timeout=300, check=True)
    lines = build()
    assert "[localbase] image localbase-a: built" in lines and "[localbase] image localbase-b: built" in lines, lines
    assert node.run(files, check=True).stdout.split() == ["a2", "b"]

    # a's build fails: b is not built, in one line naming a
    (stack / "a" / "Dockerfile").write_text("FROM c2s/python:test\nRUN echo a3 > /a.txt && false\n")
    node.c2s(f"-f local-base-stack/compose.yaml convert --registry-mirror {node.registry} -o localbase-out",
             timeout=300, check=True)
    proc = node.run(f"cd / && {build_sh}", timeout=900)
    assert proc.returncode == 1
    assert "[localbase] image localbase-b: not built: it starts from image localbase-a, which failed" in proc.stderr
    assert "run.sh: building image localbase-a failed; last lines of " in proc.stderr, proc.stderr
    assert node.run(files, check=True).stdout.split() == ["a2", "b"]  # the last good SIFs are kept

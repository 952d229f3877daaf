"""The plan's volumes and host files as Docker has them: parents mounted before children with their
mount points recorded, image VOLUMEs as anonymous volumes filled from the image, nocopy, host paths
outside the project, the Docker socket."""
import textwrap

from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.binds import is_docker_socket
from compose2sif.plan.dockerfile import convert
from compose2sif.registry import ImageConfig


def plan_for(tmp_path, compose, files=None, environ=None, **kw):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    for name, content in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u", **(environ or {})}))
    return build_plan(project, PlanOptions(port_base=30000, address_block="127.0.9", **kw))


def binds(plan, name):
    return {b.target: b for b in next(s for s in plan.services if s.name == name).binds}


def test_parents_are_mounted_before_children_and_the_child_mount_point_is_recorded(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example.org/app:1
            volumes: ["/app/node_modules", "./frontend:/app", "data:/app/data/cache"]
        volumes: {data: {}}
        """)
    order = [b.target for b in next(s for s in plan.services if s.name == "app").binds]
    assert order.index("/app") < order.index("/app/node_modules") < order.index("/app/data/cache")
    app = binds(plan, "app")
    assert sorted(app["/app"].mount_points) == ["data/cache", "node_modules"]
    anonymous = app["/app/node_modules"]
    assert anonymous.kind == "volume" and anonymous.anonymous and anonymous.fill
    assert anonymous.source.startswith("state/anonymous/app/")
    assert app["/app"].kind == "bind" and not app["/app"].fill


def test_named_volumes_are_filled_unless_nocopy_and_never_with_a_subpath(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example.org/app:1
            volumes:
              - code:/srv/code
              - {type: volume, source: cache, target: /srv/cache, volume: {nocopy: true}}
              - {type: volume, source: code, target: /srv/part, volume: {subpath: sub}}
        volumes: {code: {}, cache: {}}
        """)
    app = binds(plan, "app")
    assert app["/srv/code"].fill and not app["/srv/code"].anonymous
    assert app["/srv/code"].source == "state/volumes/code"
    assert not app["/srv/cache"].fill
    assert not app["/srv/part"].fill


def test_each_image_volume_is_an_anonymous_volume_unless_mounted_over(tmp_path):
    configs = {"example.org/db:1": ImageConfig(volumes=["/var/lib/db", "/etc/db"])}
    plan = plan_for(tmp_path, """
        services:
          db:
            image: example.org/db:1
            volumes: ["./conf:/etc/db"]
        """, image_configs=configs)
    db = binds(plan, "db")
    assert db["/var/lib/db"].anonymous and db["/var/lib/db"].fill
    assert db["/etc/db"].kind == "bind"


def test_a_dockerfile_volume_is_an_anonymous_volume(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web:
            build: .
        """, files={"Dockerfile": 'FROM example.org/base:1\nARG D=/data\nVOLUME ["$D", "/logs"]\nVOLUME /x /y\n'})
    web = binds(plan, "web")
    for path in ("/data", "/logs", "/x", "/y"):
        assert web[path].anonymous and web[path].fill, path


def test_dockerfile_volume_forms():
    converted = convert('FROM alpine\nVOLUME /a\nVOLUME ["/b", "/c/"]\n', "/ctx", {}, None, "Dockerfile",
                        lambda i: f"docker.io/library/{i}", lambda i: None)
    assert converted.volumes == ["/a", "/b", "/c"]


def test_host_paths_outside_the_project_are_checked_and_missing_ones_warned_about(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example.org/app:1
            volumes: ["/etc/localtime:/etc/localtime:ro", "/nonexistent-c2s/models:/models", "./here:/here"]
        """)
    app = binds(plan, "app")
    assert app["/etc/localtime"].host_path and app["/models"].host_path
    assert not app["/here"].host_path
    missing = [w for w in plan.warnings if "/nonexistent-c2s/models" in w]
    assert len(missing) == 1 and "'app'" in missing[0] and "override file" in missing[0]
    assert not any("/etc/localtime" in w for w in plan.warnings)


def test_mount_options_without_effect_are_named_never_dropped_silently(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example.org/app:1
            volumes:
              - ./x:/x:z
              - {type: bind, source: ./y, target: /y, read_only: true, bind: {propagation: rshared}}
              - {type: tmpfs, target: /t, tmpfs: {size: 1000}}
              - {type: volume, source: v, target: /v, volume: {nocopy: true}}
        volumes: {v: {driver_opts: {type: nfs}}}
        """)
    said = [w for w in plan.warnings if "ignored" in w]
    assert any("/x: bind.selinux ignored" in w for w in said), said
    assert any("/y: bind.propagation ignored" in w for w in said), said
    assert any("/t: tmpfs.size ignored" in w for w in said), said
    assert any("'v': driver_opts (type) are ignored" in w for w in said), said
    assert not any("/v:" in w for w in said), said  # nocopy is done, not ignored


def test_the_docker_socket_in_each_form_is_warned_about_and_never_created(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          a: {image: example.org/a:1, volumes: ["/var/run/docker.sock:/var/run/docker.sock"]}
          b: {image: example.org/b:1, volumes: ["${XDG_RUNTIME_DIR}/docker.sock:/var/run/docker.sock:ro"]}
          c: {image: example.org/c:1, volumes: ["${ENGINE:-/srv/engine}:/tmp/d.sock"]}
        """, environ={"XDG_RUNTIME_DIR": "/run/user/1000", "DOCKER_HOST": "unix:///srv/engine"})
    for name in "abc":
        sockets = [b for b in binds(plan, name).values() if b.socket]
        assert len(sockets) == 1 and not sockets[0].create, name
        assert any(f"service {name!r}: binds the Docker socket" in w and "no Docker daemon" in w
                   for w in plan.warnings), name


def test_docker_socket_paths():
    assert is_docker_socket("/var/run/docker.sock", {})
    assert is_docker_socket("/run/user/1000/docker.sock", {})
    assert is_docker_socket("/srv/engine", {"DOCKER_HOST": "unix:///srv/engine"})
    assert not is_docker_socket("/srv/engine", {"DOCKER_HOST": "tcp://host:2375"})
    assert not is_docker_socket("/var/run/postgresql", {})


# ---- run.sh, under the RECORDING STAND-IN for apptainer (tests/standins), in its running mode ----

import os  # noqa: E402
import subprocess  # noqa: E402

from helpers import REPO, converted_on_standin as converted, recorded_calls as calls  # noqa: E402

RUN_COMPOSE = """
services:
  app:
    image: example.org/app:1
    volumes:
      - ./src:/app
      - /app/node_modules
      - data:/srv/data
      - full:/srv/full
      - {type: volume, source: cache, target: /srv/cache, volume: {nocopy: true}}
      - /var/run/docker.sock:/var/run/docker.sock
volumes: {data: {}, full: {}, cache: {}}
"""


def test_up_fills_only_empty_volumes_makes_mount_points_and_leaves_the_socket_out(tmp_path):
    out, run = converted(tmp_path, RUN_COMPOSE)
    (out / "state" / "volumes" / "full").mkdir(parents=True)
    (out / "state" / "volumes" / "full" / "kept").write_text("mine\n")
    try:
        proc = run("up", "-d")
        assert proc.returncode == 0, proc.stderr
        assert "no Docker daemon" in proc.stderr and "/var/run/docker.sock" in proc.stderr
        fills = {c[c.index("--bind") + 1].split(":")[0]: c[-2] for c in calls(tmp_path)
                 if c[:1] == ["exec"] and "/.c2s-fill" in " ".join(c)}
        state = out / "state"
        assert fills == {str(state / "volumes" / "data"): "/srv/data",
                         str(state / "anonymous" / "app" / "app_node_modules"): "/app/node_modules"}
        assert os.listdir(state / "volumes" / "full") == ["kept"]  # nothing written into a volume
        assert (tmp_path / "proj" / "src" / "node_modules").is_dir()  # the child's mount point, as Docker
        start = next(c for c in calls(tmp_path) if c[:2] == ["instance", "start"])
        binds = [start[i + 1] for i, a in enumerate(start) if a == "--bind"]
        assert not any("docker.sock" in b for b in binds)
        targets = [b.split(":")[1] for b in binds]
        assert targets.index("/app") < targets.index("/app/node_modules")
        (state / "anonymous" / "app" / "app_node_modules" / "x").write_text("")
        assert run("down").returncode == 0
        assert not (state / "anonymous").exists() and (state / "volumes" / "full" / "kept").exists()
    finally:
        run("down")


def test_up_stops_before_anything_starts_on_a_host_path_nobody_can_create(tmp_path):
    out, run = converted(tmp_path, "services:\n  app:\n    image: example.org/app:1\n"
                                   "    volumes: [/proc/c2s-not-creatable:/data]\n")
    proc = run("up", "-d")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "/proc/c2s-not-creatable" in line]
    assert len(lines) == 1 and "service app" in lines[0] and "override file" in lines[0], proc.stderr
    assert not any(c[:2] == ["instance", "start"] or "/.c2s-fill" in " ".join(c) for c in calls(tmp_path))


def test_an_exposed_port_never_refuses_or_moves_and_is_not_needed(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web: {image: example.org/web:1, command: [serve, "8000"], expose: ["8000"]}
          worker: {image: example.org/web:1, command: [work], expose: ["8000"]}
        """, image_configs={"example.org/web:1": ImageConfig(exposed=[8000])})
    for service in plan.services:
        assert [(p.container, p.host, p.required) for p in service.ports] == [(8000, 8000, False)], service.name


# ---- profiles, selected as Docker Compose selects them: `config` equal to the oracle on each form ----

from oracle import base_env, differences, oracle_mark, run_oracle, run_ours  # noqa: E402

import pytest  # noqa: E402

PROFILES_COMPOSE = """
services:
  always: {image: example.org/app:1}
  empty-or-gpu: {image: example.org/app:1, profiles: ["", gpu]}
  gpu-only: {image: example.org/app:1, profiles: [gpu]}
  needs-empty: {image: example.org/app:1, profiles: [""], depends_on: [empty-or-gpu]}
"""
# (global flags, COMPOSE_PROFILES or None): no profile asked for, an empty COMPOSE_PROFILES, one with
# a trailing comma, `--profile ''`, a named profile alone, one nobody has, and every profile
PROFILE_FORMS = [([], None), ([], ""), ([], "gpu,"), ([], "gpu"), (["--profile", ""], None),
                 (["--profile", "gpu"], None), (["--profile", "other"], None), (["--profile", "*"], None),
                 (["--profile", ""], "other")]


@oracle_mark()
@pytest.mark.parametrize("flags,variable", PROFILE_FORMS, ids=[f"{' '.join(f) or 'none'}-{v!r}" for f, v in PROFILE_FORMS])
def test_profiles_select_the_services_docker_compose_selects(tmp_path, flags, variable):
    (tmp_path / "compose.yaml").write_text(PROFILES_COMPOSE)
    env = base_env({} if variable is None else {"COMPOSE_PROFILES": variable})
    rc, theirs, err = run_oracle(flags, tmp_path, env)
    mine, ours, my_err = run_ours(flags, tmp_path, env)
    assert rc == 0, err
    assert mine == 0, f"the oracle accepts it ({sorted(theirs['services'])}); compose2sif: {my_err}"
    assert sorted(ours["services"]) == sorted(theirs["services"])  # needs-empty's depends_on holds
    assert not differences(ours, theirs), "\n".join(differences(ours, theirs))


# ---- fill_volume's fast way, sourced from run/lib: a real unsquashfs on a real squashfs partition ----

import shutil  # noqa: E402

SIF_LIST_STANDIN = """#!/bin/sh
# STAND-IN for apptainer, for this test only: `sif list` answers as Apptainer 1.4 prints it, the
# squashfs partition at byte 8192; any other call (the runtime's copy) fails, so what fills the
# volume can only be unsquashfs.
if [ "$1 $2" = "sif list" ]; then
    echo '------------------------------------------------------------------------------'
    echo 'ID   |GROUP   |LINK    |SIF POSITION (start-end)  |TYPE'
    echo '------------------------------------------------------------------------------'
    echo '1    |1       |NONE    |4096-4200                 |Def.FILE'
    echo '4    |1       |NONE    |8192-999999               |FS (Squashfs/*System/amd64)'
    exit 0
fi
echo "FATAL: stand-in: no runtime here" >&2
exit 1
"""


def tree_of(root):
    return sorted((str(p.relative_to(root)), oct(p.lstat().st_mode), int(p.lstat().st_mtime),
                   os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else b"")
                  for p in [root, *root.rglob("*")] if p != root) + [("", oct(root.stat().st_mode),
                                                                       int(root.stat().st_mtime), b"")]


@pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("unsquashfs")) and not os.environ.get("CI"),
                    reason="squashfs-tools is not installed (in CI, which installs it, the test runs and fails)")
def test_an_empty_volume_is_filled_straight_out_of_the_sif(tmp_path):
    image = tmp_path / "image"
    app = image / "srv" / "app"
    (app / "sub").mkdir(parents=True)
    (app / "a.txt").write_text("a\n")
    (app / "sub" / "run").write_text("#!/bin/sh\n")
    os.chmod(app / "a.txt", 0o640)
    os.chmod(app / "sub" / "run", 0o755)
    os.symlink("a.txt", app / "link")
    os.symlink("app", image / "srv" / "through-link")
    for path in (app / "a.txt", app / "sub" / "run", app / "sub", app):
        os.utime(path, (1_000_000_000, 1_000_000_000))
    os.chmod(app, 0o555)  # a read-only directory: its entries still move out
    subprocess.run(["mksquashfs", str(image), str(tmp_path / "fs"), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    (tmp_path / "x.sif").write_bytes(b"\0" * 8192 + (tmp_path / "fs").read_bytes())
    runtime = tmp_path / "standin-apptainer"
    runtime.write_text(SIF_LIST_STANDIN)
    runtime.chmod(0o755)
    volumes = tmp_path / "volumes"
    for name in ("empty", "full", "linked"):
        (volumes / name).mkdir(parents=True)
    (volumes / "full" / "mine").write_text("kept\n")
    fill = lambda volume, target: subprocess.run(  # noqa: E731
        ["bash", "-c", '. "$0/run/lib/core.sh" && . "$0/run/lib/start.sh" && fill_volume "$1" "$2"', str(REPO),
         str(volumes / volume), target], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "RT": str(runtime), "S_SIF": str(tmp_path / "x.sif"), "RUNDIR": str(tmp_path)})
    try:
        done = fill("empty", "/srv/app")
        assert done.returncode == 0, done.stdout + done.stderr
        assert tree_of(volumes / "empty") == tree_of(app)
        assert fill("full", "/srv/app").returncode == 0 and os.listdir(volumes / "full") == ["mine"]
        # a link on the way to the target: unsquashfs cannot, the runtime's copy is asked (and fails here)
        failed = fill("linked", "/srv/through-link")
        assert failed.returncode != 0 and "could not fill volume" in failed.stdout, failed.stdout + failed.stderr
        assert os.listdir(volumes / "linked") == []
        assert sorted(os.listdir(volumes)) == ["empty", "full", "linked"]  # nothing left beside them
    finally:
        for path in (app, volumes / "empty"):
            if path.exists():
                path.chmod(0o755)

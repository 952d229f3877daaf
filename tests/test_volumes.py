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
    return build_plan(project, PlanOptions(port_base=30000, address_block="127.0.9", busy=set(), **kw))


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

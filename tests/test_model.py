"""The typed model the planner consumes: long syntax, seconds, argument lists, explicit GPUs."""
from pathlib import Path

from compose2sif.load import ProjectOptions, load_project
from compose2sif.model import ALL, Dependency, GpuRequest, Healthcheck, Mount, PortMapping, services

CORPUS = Path(__file__).parent / "corpus"
STACKS = Path(__file__).resolve().parent.parent / "stacks"


def load(case, **kw):
    return services(load_project(ProjectOptions(cwd=str(CORPUS / case), environ={"HOME": "/home/t"}, **kw)))


def load_stack(name):
    return services(load_project(ProjectOptions(cwd=str(STACKS / name), environ={"HOME": "/home/t"})))


def test_llm_chat_stack_is_typed():
    svc = load_stack("llm-chat")
    llm = svc["llm"]
    assert llm.command[:2] == ["--model", "/models/Qwen2.5-7B-Instruct"]
    assert llm.command[llm.command.index("--tensor-parallel-size") + 1] == "4"
    assert llm.gpus == [GpuRequest(count=4)]
    assert llm.healthcheck == Healthcheck(test=("CMD-SHELL", "curl -fsS http://localhost:8000/health || exit 1"),
                                          interval=30.0, timeout=30.0, retries=3, start_period=600.0)
    assert llm.ulimits["memlock"] == (-1, -1)
    assert Mount(type="tmpfs", target="/tmp", create_host_path=False) in llm.mounts
    models = next(m for m in llm.mounts if m.target == "/models")
    assert models.type == "bind" and models.read_only and models.source == str(STACKS / "llm-chat" / "models")
    proxy = svc["proxy"]
    assert proxy.ports == [PortMapping(target=80, published="8080")]
    assert proxy.depends_on == [Dependency("web", "service_healthy")]
    api = svc["api"]
    assert api.environment["DATABASE_URL"] == "postgresql://chat:change-me@db:5432/chat"
    assert api.environment["REDIS_URL"] == "redis://:change me too@redis:6379/0"
    assert api.environment["EXTRA"] == "from-api-env"
    assert Dependency("llm", "service_healthy") in api.depends_on
    assert svc["db"].healthcheck.interval == 5.0 and svc["db"].healthcheck.retries == 10
    assert svc["web"].build["context"] == str(STACKS / "llm-chat" / "web")


def test_gpu_forms():
    svc = load("gpus")
    assert svc["all-gpus"].gpus == [GpuRequest(count=ALL)]
    assert svc["gpus-list"].gpus[0].device_ids == ("0", "1")
    assert svc["reservation-count"].gpus[0].count == 2
    assert svc["reservation-all"].gpus[0].count == ALL
    assert svc["reservation-default"].gpus[0].count == ALL
    assert svc["reservation-ids"].gpus[0].device_ids == ("2", "3")
    assert svc["runtime"].gpus == [] and svc["runtime"].runtime == "nvidia"


def test_optional_dependency_on_disabled_service_is_dropped():
    svc = load("profiles")
    assert [d.service for d in svc["app"].depends_on] == ["db"]
    svc = load("profiles", profiles=["debug"])
    assert sorted(d.service for d in svc["app"].depends_on) == ["db", "debugger"]


def test_commands_split_like_a_shell():
    svc = load("commands")
    assert svc["shell-string"].command == ["echo", "hello world", "single quoted", "back slash", "$HOME", "end"]
    assert svc["shell-string"].entrypoint == ["/bin/sh", "-c"]
    assert svc["folded"].command == ["--model", "/models/m", "--port", "8000"]
    assert svc["empty-list"].command == []
    assert svc["none"].command is None and svc["none"].entrypoint is None


def test_healthcheck_disable_and_none():
    svc = load("healthchecks")
    assert svc["disabled"].healthcheck.disabled
    assert svc["none"].healthcheck.disabled
    assert svc["shell"].healthcheck.timeout == 1.5 and svc["shell"].healthcheck.start_interval == 0.5
    assert svc["cmdshell"].healthcheck.interval == 2 * 86400
    assert svc["empty"].healthcheck == Healthcheck(test=())


def test_keys_the_planner_reads_are_typed(tmp_path):
    (tmp_path / "compose.yaml").write_text("""services:
  app:
    image: a
    expose: ["9000", "7000-7002", "53/udp"]
    stop_signal: SIGINT
    stop_grace_period: 1m30s
    pull_policy: always
    networks: [front, back]
    deploy: {replicas: 3, resources: {limits: {cpus: "2"}}}
  plain: {image: b}
networks: {front: {}, back: {}}
""")
    svc = services(load_project(ProjectOptions(cwd=str(tmp_path), environ={})))
    app, plain = svc["app-2"], svc["plain"]  # three replicas: app-1..app-3 (tests/test_replicas.py)
    assert (app.replica_of, app.replica) == ("app", 2)
    assert app.expose == ["9000", "7000-7002", "53/udp"]
    assert (app.stop_signal, app.stop_grace_period, app.pull_policy) == ("SIGINT", 90.0, "always")
    assert sorted(app.networks) == ["back", "front"] and app.replicas == 3 and app.limits == {"cpus": 2.0}
    assert (plain.stop_signal, plain.stop_grace_period, plain.pull_policy) == (None, 10.0, "missing")  # (the image's, else SIGTERM: the plan)
    assert plain.networks == ["default"] and plain.replicas is None and plain.limits == {}

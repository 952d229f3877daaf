"""The planner: port remapping, reference rewriting, binds, levels, GPUs, warnings."""
import textwrap
from pathlib import Path

import pytest

from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.ports import PortRequest, allocate, default_base
from compose2sif.plan.knowledge import Setter, repository


def plan_for(tmp_path, compose, busy=(), base=30000, files=None, **kw):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    for name, content in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    return build_plan(project, PlanOptions(port_base=base, busy_ports=set(busy), **kw))


def port(plan, service, container):
    return next(p for p in plan.service(service).ports if p.container == container)


def test_two_services_on_one_port_and_a_privileged_port_are_moved(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          api: {image: redis:7}
          worker: {image: redis:7, command: redis-server --appendonly yes}
          web: {image: nginx, ports: ["8080:80"]}
    """)
    api, worker = port(plan, "api", 6379), port(plan, "worker", 6379)
    assert api.host != worker.host and {api.host, worker.host} <= set(range(30000, 30100))
    assert "--port" in plan.service("worker").launch and str(worker.host) in plan.service("worker").launch
    assert plan.service("worker").launch[:4] == ["/.singularity.d/runscript", "redis-server", "--appendonly", "yes"]
    web = port(plan, "web", 80)
    assert web.host == 8080 and web.published and web.address == "0.0.0.0"


def test_published_privileged_port_moves_with_a_warning(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web: {image: nginx, ports: ["80:80"]}
    """)
    assert port(plan, "web", 80).host == 30000
    assert any("published port 80 is privileged" in w for w in plan.warnings)


def test_busy_ports_are_skipped(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          db: {image: postgres:16}
          cache: {image: redis:7, ports: ["6380:6379"]}
    """, busy={30000, 30001, 6380})
    assert port(plan, "cache", 6379).host == 30002  # services in name order take the free ports
    assert port(plan, "db", 5432).host == 30003
    assert any("published port 6380 is taken" in w for w in plan.warnings)


def test_allocation_is_deterministic_and_per_user(tmp_path):
    requests = [PortRequest("b", 80, None, None, Setter("env", "P")), PortRequest("a", 80, None, None, Setter("env", "P"))]
    first = allocate(list(requests), 30000, set(), [])
    second = allocate(list(reversed(requests)), 30000, set(), [])
    assert first == second and first[("a", 80)].host == 30000
    assert default_base("proj", uid=1000) != default_base("proj", uid=1001)
    assert default_base("proj", uid=1000) != default_base("other", uid=1000)
    assert default_base("proj", uid=1000) == default_base("proj", uid=1000)


def test_references_inside_urls_with_credentials_are_rewritten(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          redis: {image: redis:6-alpine}
          db: {image: postgres:15-alpine, environment: {POSTGRES_PASSWORD: x}}
          api:
            image: langgenius/dify-api:1.17.1
            environment:
              CELERY_BROKER_URL: redis://:difyai123456@redis:6379/1
              DATABASE: postgresql://user:p%40ss@db:5432/dify?sslmode=disable
              DB_HOST: db
              DB_PORT: "5432"
              REDIS_HOST: redis
              REDIS_PORT: 6379
              OTHER_PORT: "6379"
              NOT_A_SERVICE: http://example.org:6379
              PREFIX_MATCH: http://myredis:6379
            command: ["--broker", "redis://redis:6379/2"]
    """)
    redis, db = port(plan, "redis", 6379).host, port(plan, "db", 5432).host
    env = plan.service("api").environment
    assert env["CELERY_BROKER_URL"] == f"redis://:difyai123456@redis:{redis}/1"
    assert env["DATABASE"] == f"postgresql://user:p%40ss@db:{db}/dify?sslmode=disable"
    assert env["DB_PORT"] == str(db) and env["REDIS_PORT"] == str(redis)
    assert env["OTHER_PORT"] == "6379"
    assert env["NOT_A_SERVICE"] == "http://example.org:6379"
    assert env["PREFIX_MATCH"] == "http://myredis:6379"
    assert plan.service("api").launch[-1] == f"redis://redis:{redis}/2"
    assert env["DIFY_PORT"] == str(port(plan, "api", 5001).host) and env["DIFY_BIND_ADDRESS"] == "127.0.0.1"


def test_own_healthcheck_follows_its_port(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          api:
            image: example/api
            command: uvicorn app:app --host 0.0.0.0 --port 8000
            healthcheck: {test: "curl -f http://localhost:8000/health"}
          cache:
            image: redis:7
            healthcheck: {test: ["CMD", "redis-cli", "ping"]}
    """)
    api = port(plan, "api", 8000).host
    assert plan.service("api").healthcheck["test"] == ["CMD-SHELL", f"curl -f http://localhost:{api}/health"]
    assert plan.service("api").launch[-4:] == ["--host", "127.0.0.1", "--port", str(api)]
    cache = port(plan, "cache", 6379).host
    assert plan.service("cache").healthcheck["test"] == ["CMD", "redis-cli", "-p", str(cache), "ping"]


def test_unknown_service_port_stays_and_clash_is_reported(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          a: {image: example/a, ports: ["9000:9000"]}
          b: {image: example/b, expose: ["9000"]}
    """)
    assert port(plan, "a", 9000).host == 9000 and port(plan, "b", 9000).host == 9000
    assert any("also used by another service" in w for w in plan.warnings)


def test_hints_teach_the_planner(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example/app
            ports: ["8000"]
            x-compose2sif:
              ports: {"8000": {env: APP_PORT}}
              bind_address: {env: APP_HOST}
              writable: [/var/lib/app]
    """)
    app = plan.service("app")
    assert app.environment["APP_PORT"] == str(port(plan, "app", 8000).host)
    assert app.environment["APP_HOST"] == "0.0.0.0"  # published (no host port given)
    assert any(b.target == "/var/lib/app" and b.kind == "scratch" for b in app.binds)


def test_volumes_levels_oneshot_gpus(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          init: {image: busybox, command: ["true"]}
          db:
            image: postgres:16
            volumes: [pgdata:/var/lib/postgresql/data, ./conf:/etc/conf:ro, /anon]
            tmpfs: [/run/x]
          llm:
            image: vllm/vllm-openai:v0.19.1
            deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 2, capabilities: [gpu]}]}}}
            depends_on:
              init: {condition: service_completed_successfully}
              db: {condition: service_healthy}
        volumes: {pgdata: {}}
    """)
    assert [s.name for s in plan.services] == ["db", "init", "llm"]
    assert plan.service("llm").level == 1 and plan.service("init").oneshot
    assert plan.service("llm").nv and plan.service("llm").gpus == [{"count": 2, "device_ids": []}]
    binds = {b.target: b for b in plan.service("db").binds}
    assert binds["/var/lib/postgresql/data"].source == "state/volumes/pgdata"
    assert binds["/etc/conf"].read_only and binds["/etc/conf"].source == str(tmp_path / "conf")
    assert binds["/anon"].source.startswith("state/volumes/_anonymous_db_")
    assert binds["/run/x"].kind == "tmpfs" and binds["/tmp"].kind == "scratch"
    assert binds["/var/run/postgresql"].kind == "scratch"


def test_unsupported_keys_warn_with_what_happens(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example/app
            privileged: true
            user: "1000"
            networks: [front, back]
            deploy: {replicas: 3, resources: {limits: {memory: 1g}}}
        networks: {front: {}, back: {}}
    """)
    text = "\\n".join(plan.warnings)
    assert "`privileged` is not supported" in text and "`user` is not supported" in text
    assert "networks are not isolated" in text and "replicas 3 becomes one instance" in text
    assert "limits are not enforced" in text


def test_nginx_template_rendered_with_plan(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          proxy:
            image: nginx:1.27
            ports: ["8080:80"]
            environment: {UPSTREAM: "api:5001", SERVER_NAME: chat}
            volumes: [./default.conf.template:/etc/nginx/templates/default.conf.template:ro]
          api: {image: langgenius/dify-api:1.17.1}
          web: {image: langgenius/dify-web:1.17.1}
    """, files={"default.conf.template": """
        server {
            listen 80 default_server;
            listen [::]:80;
            server_name ${SERVER_NAME} $UNDEFINED;
            location /api { proxy_pass http://${UPSTREAM}; }
            location / { proxy_pass http://web:3000; }
        }
    """})
    api, web = port(plan, "api", 5001).host, port(plan, "web", 3000).host
    (path, text), = plan.configs.items()
    assert path == "config/proxy/root/etc/nginx/conf.d/default.conf"
    assert "listen 0.0.0.0:8080 default_server;" in text and "listen [::]:8080;" in text
    assert "server_name chat $UNDEFINED;" in text
    assert f"proxy_pass http://api:{api};" in text and f"proxy_pass http://web:{web};" in text
    binds = {b.target: b for b in plan.service("proxy").binds}
    assert binds["/etc/nginx/conf.d"].source == "config/proxy/root/etc/nginx/conf.d" and binds["/etc/nginx/conf.d"].read_only
    assert "/etc/nginx/templates/default.conf.template" not in binds
    assert binds["/var/cache/nginx"].kind == "scratch"


def test_repository_names():
    assert repository("nginx:1.27") == "nginx"
    assert repository("docker.io/library/nginx@sha256:abc") == "library/nginx"
    assert repository("127.0.0.1:5000/c2s/postgres:test") == "c2s/postgres"
    assert repository("localhost/x/y") == "x/y"


def test_bad_hint_is_one_clear_error(tmp_path):
    from compose2sif.errors import ComposeError
    with pytest.raises(ComposeError, match=r"services.app.x-compose2sif.ports"):
        plan_for(tmp_path, """
            services:
              app:
                image: example/app
                x-compose2sif: {ports: {"http": {env: PORT}}}
        """)


def test_redis_password_moves_off_the_command_line(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          redis:
            image: redis:7
            command: redis-server /usr/local/etc/redis/redis.conf --requirepass 's3"cr\\et' --appendonly yes
            healthcheck: {test: ["CMD", "redis-cli", "-a", 's3"cr\\et', "ping"]}
    """)
    redis = plan.service("redis")
    assert not any("s3" in arg for arg in redis.launch)
    assert redis.launch[1:3] == ["redis-server", "/etc/compose2sif/redis.conf"]
    assert "-a" not in redis.healthcheck["test"]
    assert redis.environment["REDISCLI_AUTH"] == 's3"cr\\et'
    conf = plan.configs["config/redis/redis/compose2sif.conf"]
    assert conf == 'include /usr/local/etc/redis/redis.conf\nrequirepass "s3\\"cr\\\\et"\n'
    assert not any("command line carries a secret" in w for w in plan.warnings)


@pytest.mark.parametrize("case", sorted(p.name for p in (Path(__file__).parent / "corpus").iterdir()))
def test_every_corpus_project_plans_or_fails_cleanly(case, tmp_path):
    """No corpus project makes the planner crash: it plans, or says what is wrong in one error."""
    from compose2sif.errors import ComposeError
    from oracle import prepare_case
    cwd, _, _, spec = prepare_case(Path(__file__).parent / "corpus" / case, tmp_path)
    source = cwd
    env = {"HOME": "/home/u", "SET": "v", "EMPTY": "", "BOTH": "h", **(spec.get("env") or {})}
    try:
        project = load_project(ProjectOptions(cwd=str(source), environ=env))
        build_plan(project, PlanOptions(port_base=30000, busy_ports=set()))
    except ComposeError as exc:
        assert str(exc)

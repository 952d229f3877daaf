"""The planner: own loopback addresses, evidence of ports, moves only where needed, clashes refused,
reference rewriting, binds, levels, GPUs, warnings."""
import textwrap
from pathlib import Path

import pytest

from compose2sif.adapters import repository
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.network import (default_address_block, default_port_base, free_address_block, overlaps,
                                      parse_address_block)

BLOCK = "127.45.3"


def plan_for(tmp_path, compose, busy=(), base=30000, files=None, **kw):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    for name, content in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    return build_plan(project, PlanOptions(port_base=base, address_block=BLOCK, busy=set(busy), **kw))


def port(plan, service, container):
    return next(p for p in plan.service(service).ports if p.container == container)


def hosts(plan):
    return {name: address for address, names in plan.hosts for name in names}


def test_every_service_keeps_its_ports_on_its_own_address(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          api:
            image: example/api
            command: uvicorn app:app --host 0.0.0.0 --port 8000
            environment: {DATABASE_URL: "postgresql://u:p@db:5432/app", REDIS_HOST: cache}
            healthcheck: {test: "curl -f http://localhost:8000/health"}
          db: {image: postgres:16, container_name: the-db}
          cache:
            image: redis:7
            healthcheck: {test: ["CMD", "redis-cli", "ping"]}
    """)
    names = hosts(plan)
    assert names["api"] == f"{BLOCK}.2" and names["cache"] == f"{BLOCK}.3"
    assert names["db"] == names["the-db"] == f"{BLOCK}.4" and names["host.docker.internal"] == "127.0.0.1"
    for service, container in (("api", 8000), ("db", 5432), ("cache", 6379)):
        endpoint = port(plan, service, container)
        assert (endpoint.address, endpoint.host) == (names[service], container), service
    api, db, cache = plan.service("api"), plan.service("db"), plan.service("cache")
    assert api.launch[-4:] == ["--host", f"{BLOCK}.2", "--port", "8000"]
    assert api.healthcheck["test"] == ["CMD-SHELL", f"curl -f http://{BLOCK}.2:8000/health"]
    assert api.environment["DATABASE_URL"] == "postgresql://u:p@db:5432/app"  # nothing moved: nothing rewritten
    assert db.launch == ["/.singularity.d/runscript", "postgres", "-c", f"listen_addresses={BLOCK}.4"]
    assert "PGPORT" not in db.environment
    assert cache.launch[-2:] == ["--bind", f"{BLOCK}.3"] and "--port" not in cache.launch
    assert cache.healthcheck["test"] == ["CMD", "redis-cli", "-h", f"{BLOCK}.3", "ping"]
    assert "referenced by api" in port(plan, "db", 5432).evidence and "flag --port" in port(plan, "api", 8000).evidence
    assert not any("all interfaces" in w for w in plan.warnings)


def test_two_services_from_one_image_on_one_port_told_their_address(tmp_path):
    plan = plan_for(tmp_path, """
        x-app: &app
          image: example/app
          environment: {PORT: "9000", HOST: "0.0.0.0", REDIS_HOST: cache}
        services:
          api: *app
          worker: *app
          cache: {image: redis:7}
    """)
    for name in ("api", "worker"):
        endpoint = port(plan, name, 9000)
        assert endpoint.host == 9000 and endpoint.address == hosts(plan)[name]
        assert plan.service(name).environment["HOST"] == hosts(plan)[name]
        assert plan.service(name).environment["PORT"] == "9000"
    assert [p.container for p in plan.service("api").ports] == [9000]  # REDIS_HOST names a client setting


def test_services_that_cannot_be_told_an_address_are_separated_by_a_port_knob(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          a: {image: example/a, environment: {PORT: "9000"}}
          b: {image: example/b, environment: {PORT: "9000"}}
          proxy:
            image: example/proxy
            environment: {A: "http://a:9000/", B: "http://b:9000/x"}
    """)
    a, b = port(plan, "a", 9000), port(plan, "b", 9000)
    assert (a.address, a.host) == ("0.0.0.0", 9000) and (b.address, b.host) == ("0.0.0.0", 30000)
    assert plan.service("b").environment["PORT"] == "30000"
    assert plan.service("proxy").environment == {"A": "http://a:9000/", "B": "http://b:30000/x"}
    assert any("'b': port 9000 is also used by service 'a'; its port 9000 is served on 0.0.0.0:30000" in w
               for w in plan.warnings)
    assert any("'a' listens on all interfaces (0.0.0.0:9000)" in w for w in plan.warnings)


def test_a_clash_that_cannot_be_resolved_is_refused_with_the_hint(tmp_path):
    with pytest.raises(ComposeError) as info:
        plan_for(tmp_path, """
            services:
              a: {image: example/a, healthcheck: {test: "curl -f localhost:9000"}}
              b: {image: example/b, healthcheck: {test: "wget -q localhost:9000"}}
        """)
    message = str(info.value)
    assert "services 'a' and 'b' both listen on port 9000" in message
    assert "b: healthcheck" in message and "on all interfaces" in message
    assert 'x-compose2sif: {ports: {"9000": {env: VAR}}}' in message and "bind_address" in message


def test_a_privileged_port_moves_through_its_knob_or_is_refused(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app: {image: example/app, command: ["serve", "--port", "80", "--host", "0.0.0.0"]}
          client: {image: example/c, environment: {URL: "http://app/api", URL2: "http://app:80/x"}}
    """)
    assert port(plan, "app", 80).host == 30000 and plan.service("app").launch[-4:] == [
        "--port", "30000", "--host", f"{BLOCK}.2"]
    assert plan.service("client").environment == {"URL": "http://app:30000/api", "URL2": "http://app:30000/x"}
    with pytest.raises(ComposeError, match=r"service 'web' listens on port 80 \(seen in: ports\).*cannot move it"):
        plan_for(tmp_path, """
            services:
              web: {image: example/web, ports: ["80"]}
        """)


def test_a_port_published_on_another_number_is_forwarded_and_the_server_keeps_its_own(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          cache: {image: redis:7, ports: ["127.0.0.1:6380:6379"]}
          app: {image: example/app, environment: {REDIS_URL: "redis://cache:6379/0"}}
    """)
    cache = port(plan, "cache", 6379)
    # as Docker's proxy: the published 127.0.0.1:6380 relays to the server's own address and port
    assert (cache.address, cache.host, cache.published, cache.forward) == (f"{BLOCK}.3", 6379, True, "127.0.0.1:6380")
    assert plan.service("cache").launch[-2:] == ["--bind", f"{BLOCK}.3"]  # its port is not moved
    assert hosts(plan)["cache"] == f"{BLOCK}.3"
    assert plan.service("app").environment["REDIS_URL"] == "redis://cache:6379/0"
    assert not any("all interfaces" in w for w in plan.warnings)


def test_flags_inside_a_shell_script_are_knobs(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example/app
            command: ["sh", "-c", "migrate && exec gunicorn -b 0.0.0.0:8000 --workers 2 app:wsgi"]
          minio:
            image: minio/minio
            command: server /data --address ":9000" --console-address ":9001"
    """)
    assert plan.service("app").launch[-1] == f"migrate && exec gunicorn -b {BLOCK}.2:8000 --workers 2 app:wsgi"
    assert port(plan, "app", 8000).address == f"{BLOCK}.2"
    minio = plan.service("minio")
    assert minio.launch[-4:] == ["--address", f"{BLOCK}.3:9000", "--console-address", f"{BLOCK}.3:9001"]
    assert [(p.container, p.address) for p in minio.ports] == [(9000, f"{BLOCK}.3"), (9001, f"{BLOCK}.3")]


def test_node_listeners_make_wildcard_services_move(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          a: {image: example/a, environment: {PORT: "8080"}}
          b: {image: example/b, environment: {PORT: "8081", HOST: "0.0.0.0"}}
    """, busy={("127.0.0.1", 8080), ("127.9.9.9", 8081)})
    assert port(plan, "a", 8080).host == 30000   # 0.0.0.0:8080 would collide with 127.0.0.1:8080
    assert port(plan, "b", 8081).host == 8081    # its own address does not
    assert overlaps(("0.0.0.0", 1), ("127.0.0.1", 1)) and not overlaps(("127.0.0.2", 1), ("127.0.0.1", 1))


def test_hints_teach_the_planner(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example/app
            expose: ["8000"]
            x-compose2sif:
              ports: {"8000": {env: APP_PORT}}
              bind_address: {env: APP_HOST}
              writable: [/var/lib/app]
          other: {image: example/other, expose: ["8000"]}
    """)
    app = plan.service("app")
    # `other` holds 8000 on every address (it cannot be told one), so app's 8000 must move too
    assert app.environment["APP_HOST"] == f"{BLOCK}.2" and app.environment["APP_PORT"] == "30000"
    assert port(plan, "other", 8000).address == "0.0.0.0" and port(plan, "app", 8000).host == 30000
    assert any(b.target == "/var/lib/app" and b.kind == "scratch" for b in app.binds)


def test_bound_config_files_follow_a_moved_port(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web: {image: example/web, command: ["serve", "--port", "80"]}
          relay:
            image: example/relay
            volumes: [./relay.yml:/etc/relay/config.yml:ro]
    """, files={"relay.yml": "upstream: http://web:80/\n"})
    relay = plan.service("relay")
    bind = next(b for b in relay.binds if b.target == "/etc/relay/config.yml")
    assert bind.kind == "config" and plan.configs[bind.source] == "upstream: http://web:30000/\n"


def test_blocks_are_deterministic_and_per_user_and_project():
    assert default_address_block("p", uid=1000) != default_address_block("p", uid=1001)
    assert default_address_block("p", uid=1000) != default_address_block("q", uid=1000)
    assert default_address_block("p", uid=1000) == default_address_block("p", uid=1000)
    assert default_port_base("p", uid=1000) != default_port_base("p", uid=1001)
    assert parse_address_block("127.45.3.0/24") == "127.45.3"
    mine = default_address_block("p", uid=1000)
    assert free_address_block("p", {(f"{mine}.9", 80)}, uid=1000) != mine  # someone else listens in it
    assert free_address_block("p", {("127.0.0.1", 80)}, uid=1000) == mine
    with pytest.raises(ComposeError):
        parse_address_block("10.0.0.0/24")


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
    assert binds["/anon"].source == "state/anonymous/db/anon"
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
    (path, text), = plan.configs.items()
    assert path == "config/proxy/root/etc/nginx/conf.d/default.conf"
    # its privileged port moves to the block on its own address; a forwarder publishes 8080 (an IPv6
    # twin on its own address does not exist: commented out)
    assert f"listen {BLOCK}.3:30000 default_server;" in text and "# listen [::]:80;  (compose2sif" in text
    assert port(plan, "proxy", 80).forward == "0.0.0.0:8080"
    assert "server_name chat $UNDEFINED;" in text
    assert "proxy_pass http://api:5001;" in text and "proxy_pass http://web:3000;" in text
    api, web = plan.service("api"), plan.service("web")
    assert api.environment["DIFY_BIND_ADDRESS"] == api.address == f"{BLOCK}.2" and "DIFY_PORT" not in api.environment
    assert web.environment["HOSTNAME"] == web.address == f"{BLOCK}.4"
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
        build_plan(project, PlanOptions(port_base=30000, busy=set()))
    except ComposeError as exc:
        assert str(exc)


def test_values_that_would_be_shell_stay_data(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          a-b: {image: example/a, gpus: [{driver: nvidia, device_ids: ["0$(touch /tmp/PWNED)"]}]}
          a_b: {image: example/b}
    """)
    from compose2sif.render import render_runner
    script = render_runner(plan)
    assert "S_GPUS=('ids=0$(touch /tmp/PWNED)')" in script
    assert "svc_0_a_b()" in script and "svc_1_a_b()" in script  # one function each
    plan.compose_files = ["/p/x\ntouch /tmp/PWNED #.yaml"]  # a newline in a path must not end the comment
    assert "\ntouch /tmp/PWNED" not in render_runner(plan)
    with pytest.raises(ComposeError, match=r"services.x.restart: invalid restart policy"):
        plan_for(tmp_path, """
            services:
              x: {image: example/x, restart: "on-failure:a[$(touch /tmp/PWNED)]"}
        """)


def test_long_dependency_chains_and_expose_ranges(tmp_path):
    chain = "\n".join(f"  s{i}: {{image: example/s, depends_on: [s{i + 1}]}}" for i in range(250))
    plan = plan_for(tmp_path, f"services:\n{chain}\n  s250: {{image: example/s, expose: ['7000-7002']}}\n")
    assert plan.service("s0").level == 250
    assert [p.container for p in plan.service("s250").ports] == [7000, 7001, 7002]

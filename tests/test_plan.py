"""The planner: own loopback addresses, evidence of ports, moves only where needed, clashes refused,
reference rewriting, binds, levels, GPUs, warnings."""
import subprocess
import textwrap
from pathlib import Path

import pytest

from compose2sif.adapters import repository
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.network import (default_address_block, default_port_base, overlaps,
                                      parse_address_block)
from helpers import check_plan

BLOCK = "127.45.3"


def plan_for(tmp_path, compose, base=30000, files=None, **kw):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    for name, content in (files or {}).items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(content))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    return build_plan(project, PlanOptions(port_base=base, address_block=BLOCK, **kw))


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


def test_a_services_own_localhost_port_points_at_its_own_address(tmp_path):
    # MongoDB's replica-set init: the service's own script and settings reach it through localhost
    plan = plan_for(tmp_path, """
        services:
          db:
            image: example/db
            command: [sh, -c, "serve & until client localhost:27017 initiate; do sleep 1; done; wait"]
            environment: {HOST: 0.0.0.0, PORT: "27017", SELF_URL: "http://127.0.0.1:27017/", OTHER: "localhost:6000"}
            volumes: [./init.sh:/init/init.sh]
    """, files={"init.sh": "client --host localhost:27017 --eval 'rs.initiate()'\n"})
    db = plan.service("db")
    own = port(plan, "db", 27017).address
    assert own == f"{BLOCK}.2" and db.launch[-1].startswith(f"serve & until client {own}:27017 initiate;")
    assert db.environment["SELF_URL"] == f"http://{own}:27017/" and db.environment["OTHER"] == "localhost:6000"
    assert plan.configs["config/db/files/init/init.sh"] == f"client --host {own}:27017 --eval 'rs.initiate()'\n"


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
    # the fix moves the port: an address alone would not part b from a, which holds 0.0.0.0:9000
    assert "fix: add to service 'b' `x-compose2sif: {ports: {\"9000\": {env: VAR}}}`" in message
    assert "bind_address" not in message


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


def test_a_wildcard_listener_overlaps_every_address_of_its_port():
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
    assert "networks are not isolated" in text and "replicas" not in text  # three instances (test_replicas.py)
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
        build_plan(project, PlanOptions(port_base=30000))
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


# ---- issue 18: evidence only from what a service reads, knobs only where it reads them ----------

def test_an_image_reference_is_not_a_service_and_port():
    from compose2sif.plan.network import References
    refs = References({"elasticsearch": ["elasticsearch"], "db": ["db"]})
    assert refs.references("image: docker.elastic.co/elasticsearch/elasticsearch:8.13.2 and repo/db:16-alpine") == []
    assert refs.references("http://elasticsearch:9200/ db:5432, tcp://db:5433") == [
        ("elasticsearch", 9200), ("db", 5432), ("db", 5433)]


def test_compose_files_and_sources_in_a_bound_tree_are_no_evidence(tmp_path):
    """The service binds the whole project: its compose file names `es:8` as an image tag and `web:80`
    in a comment, its sources `web:81`; none of that is a listener (it would be refused: < 1024)."""
    plan = plan_for(tmp_path, """
        services:
          es: {image: "repo/es:8.13.2"}   # web:80
          web: {image: example/web}
          app: {image: example/app, volumes: [".:/src"]}
    """, files={"main.py": "URL = 'http://web:81/'\n", "settings.json": '{"search": "es:9200"}\n'})
    assert [p.container for p in plan.service("web").ports] == []
    assert [p.container for p in plan.service("es").ports] == [9200]


def test_dotted_variables_reach_the_program_through_env_on_its_launch_line(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          es:
            image: example/es
            environment: ["discovery.type=single-node", "xpack.security.enabled=false", "ES_JAVA_OPTS=-Xms1g"]
          app:
            image: example/app
            command: ["serve", "--x"]
            environment: {"a.b": "$$(touch /tmp/x) 'q'"}
    """)
    es, app = plan.service("es"), plan.service("app")
    # the runscript is an sh script, and dash drops such names: bash runs it where the image has it
    assert es.launch[:2] == ["/bin/sh", "-c"] and es.launch[3:] == [
        "compose2sif-env", "2", "discovery.type=single-node", "xpack.security.enabled=false",
        "/.singularity.d/runscript"]
    assert es.environment == {"ES_JAVA_OPTS": "-Xms1g"}
    assert app.launch[4:] == ["1", "a.b=$(touch /tmp/x) 'q'", "/.singularity.d/runscript", "serve", "--x"]
    assert not any("skipped" in w for w in plan.warnings)
    # run here: the values arrive as data, the runscript's own arguments unchanged
    runscript = tmp_path / "runscript"
    runscript.write_text('#!/bin/sh\nexec "$@"\n')
    runscript.chmod(0o755)
    shown = "import os, sys; print(repr(os.environ.get('a.b')), sys.argv[1:])"
    argv = app.launch[:6] + [str(runscript), "python3", "-c", shown, "serve", "--x"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.stdout == "\"$(touch /tmp/x) 'q'\" ['serve', '--x']\n", proc.stderr


def test_a_service_scaled_to_zero_is_not_started(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app: {image: example/app, depends_on: [spare]}
          spare: {image: example/spare, deploy: {replicas: 0}}
    """)
    assert [s.name for s in plan.services] == ["app"]
    assert plan.service("app").depends_on == []
    assert any("'spare': scaled to zero" in w for w in plan.warnings)


def test_pull_policy_if_not_present_is_printed_as_compose_prints_it(tmp_path):
    from oracle import base_env, binary, run_oracle, run_ours
    (tmp_path / "compose.yaml").write_text("services:\n  a: {image: x, pull_policy: if_not_present}\n")
    rc, ours, err = run_ours([], tmp_path, base_env({}))
    assert rc == 0, err
    assert ours["services"]["a"]["pull_policy"] == "missing"
    if binary() is not None:
        assert run_oracle([], tmp_path, base_env({}))[1]["services"]["a"]["pull_policy"] == "missing"


def test_settings_one_file_hands_many_services_are_no_service_s_knob(tmp_path):
    """A project-wide .env (LISTEN_ADDR=:8888 for the one server that reads it) reaches every
    service; the others do not read it, so none is told an address through it."""
    common = {f"SETTING_{i}": str(i) for i in range(10)}
    common["LISTEN_ADDR"] = ":8888"
    (tmp_path / "common.env").write_text("".join(f"{k}={v}\n" for k, v in common.items()))
    plan = plan_for(tmp_path, """
        services:
          server: {image: example/server, env_file: common.env, ports: ["8888:8888"]}
          worker: {image: example/worker, env_file: common.env}
    """)
    assert plan.service("worker").environment["LISTEN_ADDR"] == ":8888" and plan.service("worker").ports == []
    assert plan.service("server").environment["LISTEN_ADDR"] == ":8888"
    assert plan.service("server").address == "0.0.0.0"
    assert any("'server' is published on all interfaces" in w or "'server' listens on all interfaces" in w
               for w in plan.warnings)


def test_an_address_setting_keeps_a_port_the_plan_tells_through_another_knob(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app:
            image: example/app
            environment: {BIND: "0.0.0.0:8000", PORT: "8000"}
            x-compose2sif: {ports: {"8000": {env: PORT}}}
    """)
    app = plan.service("app")
    assert app.environment["BIND"] == f"{app.address}:8000" and app.address.startswith(BLOCK)


def test_nginx_is_recognised_by_its_mounted_config_or_its_command(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          front:
            image: example/front-with-nginx
            ports: ["8888:80"]
            volumes: ["./default.conf:/etc/nginx/conf.d/default.conf:ro"]
          proxy:
            image: example/proxy
            command: ["sh", "-c", "cp /tpl/app.conf /etc/nginx/conf.d/ && exec nginx -g 'daemon off;'"]
            volumes: ["./tpl:/tpl:ro"]
    """, files={"default.conf": "server {\n  listen 80;\n}\n", "tpl/app.conf": "server {\n  listen 80;\n}\n"})
    front, proxy = plan.service("front"), plan.service("proxy")
    assert (front.adapter, proxy.adapter) == ("nginx", "nginx")
    front80 = port(plan, "front", 80)
    assert front80.host >= 1024 and f"listen {front80.address}:{front80.host};" in \
        plan.configs["config/front/root/etc/nginx/conf.d/default.conf"]
    copied = [t for p, t in plan.configs.items() if p.startswith("config/proxy/") and p.endswith("/tpl/app.conf")]
    proxy80 = port(plan, "proxy", 80)
    assert copied and f"listen {proxy80.address}:{proxy80.host};" in copied[0] and proxy80.host >= 1024


def test_minio_is_told_host_and_port_before_its_data_directories(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          minio:
            image: minio/minio:RELEASE.2025-03-12T18-04-18Z
            command: server --console-address ":9090" /data
            healthcheck: {test: ["CMD", "curl", "-f", "http://localhost:9000/minio/health/live"]}
          clickhouse: {image: example/clickhouse, healthcheck: {test: "wget -q localhost:9000"}}
    """)
    minio = plan.service("minio")
    api = port(plan, "minio", 9000)
    assert api.host != 9000 and minio.launch == [
        "/.singularity.d/runscript", "server", "--console-address", f"{minio.address}:9090",
        "--address", f"{minio.address}:{api.host}", "/data"]


def test_a_published_port_the_program_is_not_shown_to_open_is_not_refused(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web: {image: example/web, command: ["serve", "--port", "8000"], ports: ["8000:8000", "443:443"]}
    """)
    assert [p.container for p in plan.service("web").ports] == [8000]
    assert any("'web' listens on port 443 (seen in: ports)" in w for w in plan.warnings)


def test_a_built_image_s_cmd_shows_its_knobs(tmp_path):
    """Two services built from one Dockerfile whose CMD says `--host 0.0.0.0 --port 9000`: each is
    told its own address through it, so neither clash is refused; without a knob told the launch
    stays the image's own."""
    plan = plan_for(tmp_path, """
        services:
          index: {build: ./model, healthcheck: {test: "curl -f localhost:9000/health"}}
          infer: {build: ./model, healthcheck: {test: "curl -f localhost:9000/health"}}
          plain: {build: ./plain}
    """, files={"model/Dockerfile": 'FROM python:3.12\nCMD ["uvicorn", "main:app", "--host", "0.0.0.0", '
                                    '"--port", "9000"]\n',
                "plain/Dockerfile": 'FROM python:3.12\nCMD ["python3", "-m", "http.server"]\n'})
    for name in ("index", "infer"):
        service = plan.service(name)
        assert port(plan, name, 9000).host == 9000 and service.address.startswith(BLOCK)
        assert service.launch == ["/.singularity.d/runscript", "uvicorn", "main:app", "--host", service.address,
                                  "--port", "9000"]
    assert plan.service("plain").launch is None


def test_a_pulled_image_s_env_and_cmd_show_its_knobs(tmp_path):
    """Servers on 3000 (a Node default) are refused when nothing says how to tell them; the registry's
    image configuration says it: `ENV PORT=3000 HOSTNAME=0.0.0.0`, or a CMD with --port."""
    from compose2sif.registry import ImageConfig
    compose = """
        services:
          web: {image: "example/web:1", healthcheck: {test: "curl -f localhost:3000"}}
          plugin: {image: "example/plugin:1", environment: {API: "http://web:3000"}}
          sandbox: {image: "example/sandbox:1", healthcheck: {test: "curl -f localhost:3000"}}
    """
    with pytest.raises(ComposeError, match=r"fix: add to service 'web' `x-compose2sif: \{ports: \{\"3000\": \{env: VAR"):
        plan_for(tmp_path, compose)
    configs = {"example/web:1": ImageConfig(env={"PORT": "3000", "HOSTNAME": "0.0.0.0"}),
               "example/plugin:1": ImageConfig(cmd=["node", "dist/main.js", "--port", "3000"]),
               "example/sandbox:1": ImageConfig(env={"PORT": "3000"})}
    plan = plan_for(tmp_path, compose, image_configs=configs)
    check_plan(plan)
    web, plugin, sandbox = plan.service("web"), plan.service("plugin"), plan.service("sandbox")
    assert web.environment["HOSTNAME"] == web.address and web.address.startswith(BLOCK)
    assert sandbox.environment["PORT"] == str(port(plan, "sandbox", 3000).host) != "3000"
    assert plugin.launch in (None, ["/.singularity.d/runscript", "node", "dist/main.js", "--port",
                                    str(port(plan, "plugin", 3000).host)])


def test_a_build_argument_naming_a_moved_port_is_rewritten(tmp_path):
    """`API_URL=http://api:80` is baked into the web image at build time: api moves off port 80, so
    the argument follows it; an argument naming an unmoved service's port stays as written."""
    plan = plan_for(tmp_path, """
        services:
          api: {image: example/api, command: ["serve", "--port", "80"]}
          db: {image: postgres:16}
          web:
            build: {context: ./web, args: {API_URL: "http://api:80/v1", DB: "db:5432"}}
    """, files={"web/Dockerfile": "FROM node:20\nARG API_URL\nARG DB\nRUN echo $API_URL $DB > /url\n"})
    moved = port(plan, "api", 80).host
    definition = plan.images[plan.service("web").image].text
    assert f"http://api:{moved}/v1" in definition and "db:5432" in definition and "api:80/" not in definition


def test_a_healthcheck_url_on_the_implied_port_follows_the_move(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          web:
            image: nginx:1.27
            ports: ["8080:80"]
            volumes: ["./default.conf:/etc/nginx/conf.d/default.conf:ro"]
            healthcheck: {test: ["CMD", "wget", "--spider", "http://127.0.0.1/health"]}
    """, files={"default.conf": "server {\n  listen 80;\n}\n"})
    web = port(plan, "web", 80)
    url = plan.service("web").healthcheck["test"][-1]
    assert web.host != 80 and url.endswith(f":{web.host}/health") and url.startswith(f"http://{BLOCK}.")


def test_the_stop_signal_is_the_compose_files_else_the_images_else_sigterm(tmp_path):
    """As Docker chooses it: stop_signal, else the image's STOPSIGNAL (its registry config; a
    Dockerfile's for a build), else SIGTERM; plan.json says where each came from and run.sh sends it."""
    from compose2sif.registry import ImageConfig
    compose = """
        services:
          db: {image: "example/postgres:16"}
          front: {image: "example/nginx:1", stop_signal: SIGTERM}
          built: {build: ./app}
          plain: {build: ./plain}
          unread: {image: "example/unread:1"}
    """
    files = {"app/Dockerfile": "FROM debian:12 AS base\nSTOPSIGNAL SIGQUIT\nFROM base\nCMD [\"app\"]\n",
             "plain/Dockerfile": "FROM debian:12\n"}
    configs = {"example/postgres:16": ImageConfig(stop_signal="SIGINT"),
               "example/nginx:1": ImageConfig(stop_signal="SIGQUIT")}
    plan = plan_for(tmp_path, compose, files=files, image_configs=configs)
    got = {s.name: (s.stop_signal, s.stop_signal_from) for s in plan.services}
    assert got["db"] == ("SIGINT", "image config of example/postgres:16")
    assert got["front"] == ("SIGTERM", "compose file")
    assert got["built"] == ("SIGQUIT", "Dockerfile STOPSIGNAL")  # (inherited from the stage it is built FROM)
    assert got["plain"] == ("SIGTERM", "default (the Dockerfile sets no STOPSIGNAL)")
    assert got["unread"][0] == "SIGTERM" and "--offline" in got["unread"][1]
    assert plan.to_json()["services"][0]["stop_signal_from"]
    from compose2sif.render import render_runner
    db_function = render_runner(plan).split("    S_NAME=db\n", 1)[1].split("\n}", 1)[0]
    assert "S_STOP_SIGNAL=SIGINT" in db_function


def test_hostname_is_the_nodes_only_where_neither_compose_nor_the_images_env_names_it(tmp_path):
    """Docker sets HOSTNAME to the container's name, and an image's ENV HOSTNAME (Next.js images'
    0.0.0.0, the address they bind) or compose's wins over it: run.sh is told to set it only where
    neither names it and the image's ENV is known."""
    from compose2sif.registry import ImageConfig
    compose = """
        services:
          worker: {image: "example/worker:1"}
          next: {image: "example/next:1"}
          told: {image: "example/worker:1", environment: {HOSTNAME: "0.0.0.0"}}
          unread: {image: "example/unread:1"}
          built: {build: ./app}
          built_own: {build: ./own}
    """
    files = {"app/Dockerfile": "FROM debian:12\nCMD [\"app\"]\n",
             "own/Dockerfile": "FROM debian:12\nENV HOSTNAME=0.0.0.0\nCMD [\"app\"]\n"}
    configs = {"example/worker:1": ImageConfig(env={"PATH": "/usr/bin"}),
               "example/next:1": ImageConfig(env={"HOSTNAME": "0.0.0.0"})}
    plan = plan_for(tmp_path, compose, files=files, image_configs=configs)
    got = {s.name: s.hostname_env for s in plan.services}
    assert got == {"worker": True, "next": False, "told": False, "unread": False, "built": True,
                   "built_own": False}
    from compose2sif.render import render_runner
    assert "S_HOSTNAME_ENV=1" in render_runner(plan).split("    S_NAME=worker\n", 1)[1].split("\n}", 1)[0]

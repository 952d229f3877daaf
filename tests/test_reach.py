"""Who reaches whom (compose2sif/plan/reach.py): the rules on a project that has each of Compose's
network forms, and for every real project of ../shared/realworld that the reach table loses no
connection Docker allows and adds none, each pair computed from Docker Compose's own `config` of the
project (the oracle), not from compose2sif's loader."""
import itertools
from pathlib import Path

import pytest

from compose2sif.load import ProjectOptions, load_project
from compose2sif.model import services as typed_services
from compose2sif.plan.reach import plan_reach, restricted
from oracle import base_env, oracle_mark, run_oracle
from test_realworld_config import PROJECTS, REALWORLD

NETWORKS = """
services:
  front: {image: x, networks: [web]}
  api: {image: x, networks: [web, data]}
  db: {image: x, networks: [data]}
  sandbox: {image: x, networks: [jail]}
  proxy: {image: x, networks: [jail, web]}
  sidecar: {image: x, network_mode: "service:api"}
  node: {image: x, network_mode: host}
  alone: {image: x, network_mode: none}
  plain: {image: x}
  worker: {image: x, deploy: {replicas: 2}}
networks:
  web: {}
  data: {internal: true}
  jail: {internal: true}
"""


def reach_of(tmp_path, text):
    (tmp_path / "compose.yaml").write_text(text)
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={}))
    return plan_reach(typed_services(project), project.config.get("networks") or {})


def test_each_network_form_reaches_as_docker_says(tmp_path):
    reach = reach_of(tmp_path, NETWORKS)
    assert reach["front"].services == ["api", "node", "proxy", "sidecar"] and reach["front"].outside
    assert reach["api"].services == ["db", "front", "node", "proxy", "sidecar"] and reach["api"].outside
    # on an internal network alone: its peers there, nothing beyond (not even the host-network service)
    assert reach["db"].services == ["api", "sidecar"] and not reach["db"].outside
    assert reach["sandbox"].services == ["proxy"] and not reach["sandbox"].outside
    assert reach["proxy"].services == ["api", "front", "node", "sandbox", "sidecar"] and reach["proxy"].outside
    # service:api is api's network stack: its networks and peers, api itself included
    assert reach["sidecar"].mode == "service:api" and reach["sidecar"].networks == ["web", "data"]
    assert reach["sidecar"].services == ["api", "db", "front", "node", "proxy"]
    assert reach["node"].mode == "host" and reach["node"].outside and len(reach["node"].services) == 10
    assert reach["alone"].services == [] and not reach["alone"].outside and reach["alone"].mode == "none"
    # the default network: plain and both replicas, and the host-network service beyond
    assert reach["plain"].networks == ["default"] and reach["plain"].services == ["node", "worker-1", "worker-2"]
    assert reach["worker-1"].services == ["node", "plain", "worker-2"]
    assert {n for n in reach if restricted(reach, n)} == set(reach) - {"node"}


def test_a_per_network_alias_is_found_only_on_its_network(tmp_path):
    reach = reach_of(tmp_path, """
services:
  api:
    image: x
    networks:
      web: {aliases: [api-web, api]}
      data: {aliases: [store-client]}
  front: {image: x, networks: [web]}
  db: {image: x, networks: [data]}
  both: {image: x, networks: [web, data]}
networks: {web: {}, data: {}}
""")
    assert reach["front"].hidden == {"api": ["store-client"]}
    assert reach["db"].hidden == {"api": ["api-web"]}  # (`api`, its service name, is found everywhere)
    assert reach["both"].hidden == {} and reach["api"].hidden == {}
    # a service that reaches every other but misses a name gets its own hosts file and DNS server
    reach = reach_of(tmp_path, """
services:
  api: {image: x, networks: {web: {aliases: [api-web]}, data: {}}}
  db: {image: x, networks: [data]}
networks: {web: {}, data: {}}
""")
    assert reach["db"].services == ["api"] and reach["db"].outside and reach["db"].hidden == {"api": ["api-web"]}
    assert restricted(reach, "db") and not restricted(reach, "api")


def test_a_project_on_its_default_network_alone_restricts_nobody(tmp_path):
    reach = reach_of(tmp_path, "services:\n  a: {image: x}\n  b: {image: x, ports: ['80']}\n"
                               "  c: {image: x, network_mode: host}\n")
    assert not any(restricted(reach, n) for n in reach)


def docker_pairs(config):
    """(S, T) where Docker lets S connect to T, from `docker compose config`'s JSON: they share a
    network stack or a network; T on the host network for S with a network that is not internal."""
    services = config["services"]
    internal = {n for n, spec in (config.get("networks") or {}).items() if (spec or {}).get("internal")}

    def stack(name, seen=()):
        mode = services[name].get("network_mode") or ""
        target = mode[len("service:"):] if mode.startswith("service:") else None
        return stack(target, seen + (name,)) if target in services and target not in seen else name

    def nets(name):
        return set(services[stack(name)].get("networks") or {})

    def mode(name):
        return services[stack(name)].get("network_mode") or ""
    pairs = set()
    for s, t in itertools.permutations(services, 2):
        beyond = mode(s).startswith("container:") or any(n not in internal for n in nets(s))
        if mode(s) == "host" or stack(s) == stack(t) or nets(s) & nets(t) or (mode(t) == "host" and beyond):
            pairs.add((s, t))
    return pairs


@oracle_mark()
@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_every_real_projects_reach_is_what_docker_allows(name):
    where, args = PROJECTS[name]
    cwd = REALWORLD / where
    env = base_env({})
    rc, theirs, err = run_oracle(args, cwd, env)
    assert rc == 0, f"the oracle rejected {name}: {err}"
    files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
    profiles = [args[i + 1] for i, a in enumerate(args) if a == "--profile"]
    env_files = [args[i + 1] for i, a in enumerate(args) if a == "--env-file"]
    project_name = next((args[i + 1] for i, a in enumerate(args) if a == "-p"), None)
    project = load_project(ProjectOptions(cwd=str(cwd), files=files, profiles=profiles, env_files=env_files or None,
                                          project_name=project_name, environ=env))
    services = typed_services(project)
    reach = plan_reach(services, project.config.get("networks") or {})
    base = {n: s.replica_of or n for n, s in services.items()}
    ours = {(base[s], base[t]) for s, r in reach.items() for t in r.services if base[s] != base[t]}
    wanted = {(s, t) for s, t in docker_pairs(theirs) if s in base.values() and t in base.values()}  # (not scaled to 0)
    assert not wanted - ours, f"connections Docker allows that the reach table loses: {sorted(wanted - ours)}"
    assert not ours - wanted, f"connections Docker does not allow that the reach table adds: {sorted(ours - wanted)}"
    # a per-network alias: found by the services on that network only
    unseen = {(s, t, alias) for s, r in reach.items() for t, aliases in r.hidden.items() for alias in aliases}
    assert unseen == docker_hidden(theirs, reach, services), name


def docker_hidden(config, reach, services):
    """(S, T, ALIAS) for each alias T has in `docker compose config` only on networks S is not on,
    where S reaches T (ALIAS not also one of T's other names)."""
    found = set()
    for s, r in reach.items():
        for t in r.services:
            spec = config["services"][services[t].replica_of or t].get("networks") or {}
            aliases = {n: set((v or {}).get("aliases") or []) for n, v in spec.items()}
            seen = set().union(*(aliases.get(n, set()) for n in r.networks))
            others = {t, services[t].replica_of, services[t].container_name, services[t].hostname}
            found |= {(s, t, a) for a in set().union(*aliases.values()) - seen - others}
    return found


def test_each_service_of_networks_of_its_own_gets_a_dns_port_of_its_own(tmp_path):
    from compose2sif.plan import PlanOptions, build_plan
    from compose2sif.plan.network import PORT_BLOCK, dns_port
    (tmp_path / "compose.yaml").write_text(NETWORKS.replace("  front: {image: x, networks: [web]}",
                                                            "  front: {image: x, networks: [web], ports: ['8080:80']}"))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={}))
    plan = build_plan(project, PlanOptions(loopback=True, port_base=30000, address_block="127.45.3"))
    ports = {s.name: s.dns_port for s in plan.services}
    limited = {s.name for s in plan.services if s.reach_limited}
    assert {n for n, p in ports.items() if p} == limited and "node" not in limited
    taken = {int(p.forward.rsplit(":", 1)[1]) for s in plan.services for p in s.ports if p.forward}
    mine = [ports[n] for n in sorted(limited)]
    assert len(set(mine)) == len(mine) and not set(mine) & taken
    assert all(30000 <= p < 30000 + PORT_BLOCK // 2 and p != dns_port(30000) for p in mine)


def test_each_service_hosts_file_and_dns_names_hold_the_aliases_of_its_networks_only(tmp_path):
    """run.sh's write_service_hosts (run/lib/state.sh), as `up` runs it under the tracer, on a
    converted project: STATE/hosts.d/NAME is its /etc/hosts, NAME.names what its DNS server answers."""
    import os
    import subprocess
    repo = Path(__file__).resolve().parent.parent
    (tmp_path / "compose.yaml").write_text("""
services:
  api: {image: x, networks: {web: {aliases: [api-web]}, data: {aliases: [store-client]}}}
  front: {image: x, networks: [web]}
  db: {image: x, networks: [data]}
networks: {web: {}, data: {}}
""")
    subprocess.run(["python3", "-m", "compose2sif", "-f", str(tmp_path / "compose.yaml"), "convert", "--offline",
                    "-o", str(tmp_path / "out")], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(repo)})
    text = (tmp_path / "out" / "run.sh").read_text()
    (tmp_path / "out" / "header.sh").write_text(text[:text.index("# ---- the engine (the same for every project")])
    script = (f'source {tmp_path}/out/header.sh && for f in {repo}/run/lib/*.sh; do source "$f"; done && '
              'ISOLATION=intercept write_service_hosts "127.0.0.1 localhost"$\'\\n\'')
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc
    hosts = {n: (tmp_path / "out" / "state" / "hosts.d" / n).read_text() for n in ("front", "db")}
    names = {n: set((tmp_path / "out" / "state" / "hosts.d" / f"{n}.names").read_text().split()) for n in ("front", "db")}
    assert "api-web" in names["front"] and "store-client" not in names["front"], hosts["front"]
    assert "store-client" in names["db"] and "api-web" not in names["db"], hosts["db"]
    assert hosts["front"].startswith("127.0.0.1 localhost\n") and "api-web" in hosts["front"]
    assert "store-client" not in hosts["front"] and "db" not in hosts["front"].split()

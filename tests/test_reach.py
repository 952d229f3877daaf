"""Who reaches whom (compose2sif/plan/reach.py): the rules on a project that has each of Compose's
network forms, and for every real project of ../shared/realworld that the reach table loses no
connection Docker allows and adds none, each pair computed from Docker Compose's own `config` of the
project (the oracle), not from compose2sif's loader."""
import itertools
import sys
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


ASK_DNS = """
import socket, struct, sys
def ask(server, name):
    q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    s.sendto(q + b"\\x00" + struct.pack(">HH", 1, 1), (server, int(sys.argv[1])))
    r = s.recv(512)
    return socket.inet_ntoa(r[-4:]) if struct.unpack(">H", r[6:8])[0] else "none"
for line in sys.stdin:
    server, name = line.split()
    print(server, name, ask(server, name))
"""


def test_every_service_of_networks_of_its_own_gets_a_dns_server_of_its_own_however_many(tmp_path):
    """70 services, each with its partner on a network of their own (more than the block's lower half
    has ports): `up`'s start_dns (run/lib/dns.sh) gives each a DNS server on its own address and the
    one DNS_PORT, where its tracer sends queries to 127.0.0.11 (--dns, tracer_words). Each answers
    the partner's name and not another pair's (their networks are internal: nothing is relayed to
    the node's resolver); the project's, on the gateway, knows every name."""
    import os
    import subprocess
    from helpers import packaged_helper
    repo = Path(__file__).resolve().parent.parent
    pairs = 35
    (tmp_path / "compose.yaml").write_text("services:\n" + "".join(
        f"  s{i}: {{image: x, networks: [n{i // 2}]}}\n" for i in range(2 * pairs))
        + "networks:\n" + "".join(f"  n{k}: {{internal: true}}\n" for k in range(pairs)))  # no relay: no wait
    out = tmp_path / "out"
    subprocess.run(["python3", "-m", "compose2sif", "-f", str(tmp_path / "compose.yaml"), "convert", "--offline",
                    "-o", str(out)], check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(repo)})
    text = (out / "run.sh").read_text()
    (out / "header.sh").write_text(text[:text.index("# ---- the engine (the same for every project")])
    (out / "bin" / "x86_64").mkdir(parents=True, exist_ok=True)
    if not (out / "bin" / "x86_64" / "c2s-loopback").exists():
        (out / "bin" / "x86_64" / "c2s-loopback").symlink_to(packaged_helper("c2s-loopback"))
    libs = f'source {out}/header.sh && for f in {repo}/run/lib/*.sh; do source "$f"; done && ISOLATION=intercept'
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    words = subprocess.run(["bash", "-c", libs + ' && echo "$DNS_PORT $GATEWAY" && for n in s0 s1 s69; do '
                            'load_service $n && tracer_words && echo "$S_OWN_ADDRESS ${TRACER_WORDS[*]}"; done'],
                           capture_output=True, text=True, env=env)
    assert words.returncode == 0, words.stderr
    (port, gateway), *services = [line.split() for line in words.stdout.splitlines()]
    for own, *tracer in services:
        assert tracer[tracer.index("--dns") + 1] == f"{own}:{port}"
    addresses = {names[0]: address for address, names in
                 __import__("json").loads((out / "plan.json").read_text())["hosts"] if names}
    try:
        started = subprocess.run(["bash", "-c", libs + ' && make_dirs "$STATE/logs" && write_service_hosts '
                                  '"127.0.0.1 localhost" && start_dns'], capture_output=True, text=True, env=env,
                                 timeout=300)
        assert started.returncode == 0 and "not served" not in started.stderr, started.stderr
        questions = [f"{addresses[f's{i}']} s{i ^ 1}" for i in range(2 * pairs)]
        questions += [f"{addresses['s0']} s69", f"{addresses['s69']} s0", f"{gateway} s0", f"{gateway} s69"]
        asked = subprocess.run([sys.executable, "-c", ASK_DNS, port], input="\n".join(questions) + "\n",
                               capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stderr
        said = [line.split()[2] for line in asked.stdout.splitlines()]
        assert said[:2 * pairs] == [addresses[f"s{i ^ 1}"] for i in range(2 * pairs)]
        assert said[2 * pairs:] == ["none", "none", addresses["s0"], addresses["s69"]]
    finally:
        subprocess.run(["bash", "-c", libs + " && stop_dns"], capture_output=True, env=env, timeout=60)


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

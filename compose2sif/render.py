"""Stage 4: write the plan out as files. The output directory is self-contained: copy it to a
cluster and run ``./run.sh up`` there with nothing but bash and apptainer/singularity.

    definitions/<image>.def   one per distinct image source
    sif/                      where `build` puts the SIFs
    env/<service>.env         the resolved environment, shell-quoted for --env-file, mode 0600
                              (.eval.env for runtimes without --no-eval; .health.env for a probe's password)
    config/<service>/...      rendered config files (the adapters'), secrets and configs
    hosts.names               every service's names -> its own loopback address; host.docker.internal
                              (run.sh puts them after the node's /etc/hosts, bound as /etc/hosts)
    tls/                      the certificate and key for --tls
    secrets.env               generated secrets, mode 0600
    run.sh                    the orchestrator
    plan.json                 every decision and warning, for people and tools

Everything written comes from the Plan: nothing is decided here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shlex
from typing import Dict, List, Optional, Sequence, Union

from compose2sif import helpers
from compose2sif.errors import ComposeError
from compose2sif.plan import Plan, PortPlan, ServicePlan
from compose2sif.plan.generated import SECRETS_FILE, file_text
from compose2sif.plan.network import PORT_BLOCK, dns_port, gateway_address
from compose2sif.types import WILDCARDS


def _templates_dir() -> str:
    """run/ beside the package in a checkout (also a second worktree of an editable install, whose
    compose2sif.runner would point at the first); the package compose2sif.runner once installed."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "run")
    if os.path.isfile(os.path.join(checkout, "main.sh")):
        return checkout
    from compose2sif import runner
    return os.path.dirname(os.path.abspath(runner.__file__))


def engine_files() -> List[str]:
    """The files of run/ that make the engine, in the order run.sh holds them: run/lib/*.sh, then
    run/cmd/*.sh, each in name order, then run/main.sh (last: it runs the command line). Paths
    relative to run/ (run/README.md has the map)."""
    base = _templates_dir()
    parts = [f"{folder}/{name}" for folder in ("lib", "cmd")
             for name in sorted(os.listdir(os.path.join(base, folder))) if name.endswith(".sh")]
    return parts + ["main.sh"]


def engine() -> str:
    """The engine of every run.sh: the files of engine_files() joined, a blank line between two."""
    base, texts = _templates_dir(), []
    for rel in engine_files():
        with open(os.path.join(base, rel), encoding="utf-8") as fh:
            texts.append(fh.read())
    return "\n".join(texts)
_ULIMIT_FLAGS = {"core": "c", "data": "d", "fsize": "f", "locks": "x", "memlock": "l", "msgqueue": "q",
                 "nice": "e", "nofile": "n", "nproc": "u", "rss": "m", "rtprio": "r", "sigpending": "i",
                 "stack": "s", "cpu": "t", "as": "v"}


def launch_line(service: ServicePlan) -> str:
    """The shell line the start script evals: cd, ulimits, run the command, record its exit code.
    The command runs as a child so the exit code can be kept for `ps` and restart policies; the
    signals `instance stop` sends are passed on to it. A working directory the image lacks is made,
    as Docker makes it (where the root is writable), so that `exec` finds it too."""
    parts: List[str] = []
    if service.workdir:
        workdir = shlex.quote(service.workdir)
        parts.append(f"{{ [ -d {workdir} ] || mkdir -p {workdir}; }} 2>/dev/null; cd {workdir} 2>/dev/null")
    for name, (soft, hard) in sorted(service.ulimits.items()):
        flag = _ULIMIT_FLAGS.get(name)
        if flag:
            value = "unlimited" if soft < 0 else str(soft)
            parts.append(f"ulimit -S -{flag} {value} 2>/dev/null || ulimit -S -{flag} \"$(ulimit -H -{flag})\"")
    argv = service.launch or ["/.singularity.d/runscript"]
    parts += [
        "rm -f /tmp/.c2s-exit",
        " ".join(shlex.quote(a) for a in argv) + " </dev/null & c2s_pid=$!",
        'for c2s_sig in TERM INT HUP QUIT USR1 USR2; do trap "kill -$c2s_sig $c2s_pid 2>/dev/null" $c2s_sig; done',
        'while :; do wait "$c2s_pid"; c2s_rc=$?; kill -0 "$c2s_pid" 2>/dev/null || break; done',
        'echo "$c2s_rc" >/tmp/.c2s-exit',
        'exit "$c2s_rc"',
    ]
    return "; ".join(parts)


def env_file_text(service: ServicePlan, evaluated: bool = False, extra: Optional[Dict[str, str]] = None) -> str:
    """The --env-file of a service (with ``extra``: of its healthcheck's probe). Runtimes with
    --no-eval pass values on literally. Older ones (Singularity 3.x, Apptainer 1.0) evaluate them
    once more inside the container, so for those (``evaluated``) `\\`, `$` and backquotes are
    escaped: `\\$(cmd)` stays text, and a trailing `\\` cannot swallow the next line."""
    def value(text: str) -> str:
        if evaluated:
            text = text.replace("\\", "\\\\").replace("$", "\\$").replace("`", "\\`")
        return shlex.quote(text)

    lines = [f"# environment of service {service.name} (compose2sif); read by apptainer --env-file"
             + (" on runtimes without --no-eval" if evaluated else " --no-eval")]
    environment = {**service.environment, **(extra or {})}
    lines += [f"{key}={value(environment[key])}" for key in sorted(environment)]
    lines.append(f"C2S_LAUNCH={value(launch_line(service))}")
    return "\n".join(lines) + "\n"


def _open_dir(out_dir: str, parts: List[str]) -> int:
    """A descriptor of out_dir/PARTS..., each directory made when missing (0700) and never reached
    through a symbolic link: a link planted in an output directory must not send our files elsewhere."""
    fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    for part in parts:
        if part in ("", ".", ".."):
            os.close(fd)
            raise ComposeError(f"{os.path.join(out_dir, *parts)}: not a path inside the output directory; refused")
        try:
            os.mkdir(part, 0o700, dir_fd=fd)
        except FileExistsError:
            pass
        try:
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            raise ComposeError(f"{os.path.join(out_dir, *parts)} is a symbolic link or not a directory; "
                               "compose2sif does not follow links in its output directory (remove it)") from None
        finally:
            os.close(fd)
        fd = child
    return fd


def _write(out_dir: str, relative: str, text: Union[str, bytes], mode: int = 0o600) -> None:
    """Write OUT_DIR/RELATIVE to a new file, then rename it into place: O_EXCL|O_NOFOLLOW, so a
    planted link is replaced, never written through."""
    *parents, name = relative.split("/")
    fd = _open_dir(out_dir, parents)
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        handle = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
        with (os.fdopen(handle, "wb") if isinstance(text, bytes) else os.fdopen(handle, "w", encoding="utf-8")) as fh:
            fh.write(text)
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _tmp_source(service: ServicePlan) -> str:
    for bind in service.binds:
        if bind.target == "/tmp":
            return bind.source
    return f"{service.name}-tmp-missing"


def _forward_target(port: PortPlan) -> str:
    """Where a forwarder relays: the service's endpoint (a listener on every address answers on
    127.0.0.1 too)."""
    return f"{'127.0.0.1' if port.address in WILDCARDS else port.address}:{port.host}"


def _published(port: PortPlan) -> str:
    """CONTAINER ADDR:HOST, where `port` finds a published port (HOST 0: a free one `up` chooses)."""
    return f"{port.container} {port.forward or f'{port.address}:{port.host}'}"


def _endpoint(port: PortPlan) -> str:
    """ADDR:PORT the service listens on, for run.sh; suffixed `?` when it may never be opened (run.sh
    then checks only that it is free, not that it listens). With --tls, the HTTPS port is ours to open."""
    return f"{port.address}:{port.host}" + ("" if port.required or port.how == "tls" else "?")


_HELP = """\
# Standalone: needs only bash and apptainer (or singularity) on the node. No Python.
#
#   ./run.sh build [--pull]        build the SIFs that are missing or whose definition changed;
#                                  --pull also where the registry tag an image starts from moved
#   ./run.sh pull [SERVICE...]     fetch again the images run from a registry whose tag moved
#   ./run.sh up [-d] [SERVICE...]  start services (and what they depend on) in dependency order;
#                                  without -d, stay in the foreground, keep restart policies, and
#                                  stop everything on SIGTERM/SIGINT (the end of a batch job);
#                                  C2S_LISTEN_TIMEOUT=SECONDS (60): the wait for a service with no
#                                  healthcheck to listen (a slower one is watched, not failed)
#   ./run.sh down [-v]             stop every instance; -v also deletes the named volumes
#   ./run.sh ps [--format json]    state, health, address:port and uptime of each service
#   ./run.sh logs [-f] SERVICE     the service's output
#   ./run.sh port SERVICE PORT     where the service's PORT is published (as `docker compose port`)
#   ./run.sh exec [--index N] SERVICE CMD...   run a command inside the service's instance
#                                  (--index: which of its replicas, 1 by default)
#   ./run.sh restart SERVICE       stop and start one service
# shellcheck disable=SC2016  # single-quoted $VARs in the data below are for the instances' shells
set -o pipefail  # not -u: bash 4.2 (RHEL7) treats empty arrays as unset

HERE=${BASH_SOURCE[0]%/*}  # its directory (as dirname finds it, without a child process)
[ "$HERE" != "${BASH_SOURCE[0]}" ] || HERE=.
case ${HERE:=/} in /*) ;; *) HERE=./$HERE ;; esac  # (./: not looked up on CDPATH)
# made absolute as pwd prints it, by going there and back (a subshell would be a child process)
CALLER_DIR=$PWD
cd -- "$HERE" && HERE=$PWD || exit 1
cd -- "$CALLER_DIR" 2>/dev/null || true
"""


def _q(value) -> str:
    return shlex.quote(str(value))


def _array(values) -> str:
    """A bash array of quoted words: every value is data."""
    return "(" + " ".join(_q(v) for v in values) + ")"


def _oneline(text) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", "?", str(text))  # a comment ends at a newline


def _reach_addresses(plan: Plan, s: ServicePlan) -> str:
    """The project's addresses S may connect to (the tracer's --reach): its peers' own, and the
    gateway where it may reach beyond the project."""
    peers = [own_address(plan, plan.service(n)) for n in s.reach.get("services", [])]
    if s.reach.get("outside"):
        peers.append(gateway_address(plan.address_block))
    return ",".join(dict.fromkeys(peers))


def _hidden_names(plan: Plan, s: ServicePlan) -> List[str]:
    """ADDR:NAME of each alias S does not find: its peer's, on a network S is not on."""
    return [f"{own_address(plan, plan.service(peer))}:{alias}"
            for peer, aliases in sorted(s.reach.get("hidden_names", {}).items()) for alias in aliases]


def _service_function(s: ServicePlan, fn: str, own_address: str, reach: str = "",
                      hidden: Sequence[str] = ()) -> List[str]:
    """svc_FN(): the service's settings as run.sh's engine reads them. Keys, names of files and
    numbers are ours (plain); every other value goes through _q."""
    binds = [(f"{b.source}:{b.target}" + (":ro" if b.read_only else ""), b) for b in s.binds if not b.socket]
    by_target = {os.path.normpath(b.target): b for b in s.binds}
    mount_points = [item for b in s.binds for rel in b.mount_points
                    for item in (f"{b.source}/{rel}", by_target[os.path.normpath(os.path.join(b.target, rel))].source)]
    health = s.healthcheck
    gpus = [f"ids={','.join(map(str, g['device_ids']))}" if g["device_ids"] else f"count={g['count']}" for g in s.gpus]
    fakeroot = s.fakeroot or {}
    lines = [
        f"svc_{fn}() {{",
        f"    S_NAME={_q(s.name)}",
        f"    S_INSTANCE={_q(s.instance)}",
        f"    S_OWN_ADDRESS={_q(own_address)}",  # its hosts-file address: its loopback under the tracer
        f'    S_SIF="$HERE/sif/{s.image}.sif"',
        f'    S_ENV="$HERE/{s.env_file}"',
        f"    S_WORKDIR={_q(s.workdir or '')}",
        f"    S_TMP={_q(_tmp_source(s))}",
        f"    S_ONESHOT={1 if s.oneshot else 0}",
        f"    S_HOST_NETWORK={1 if s.host_network else 0}",  # the tracer leaves it alone: it asked for the node's network
        f"    S_NEEDS_LOOPBACK={_q(s.needs_loopback)}",  # `up` refuses it with this line where it would run untraced
        f"    S_RESTART={_q(s.restart)}",
        f"    S_NV={1 if s.nv else 0}",
        f"    S_GPUS={_array(gpus)}",
        f"    S_WRITABLE_TMPFS={1 if s.writable_tmpfs else 0}",
        f"    S_HOSTNAME_ENV={1 if s.hostname_env else 0}",  # HOSTNAME: the node's (env_flags)
        f"    S_FAKEROOT_IDS={_q(fakeroot.get('ids', ''))} S_FAKEROOT_WITHOUT={_q(fakeroot.get('without', ''))}",
        f"    S_DEPENDS={_array(d['service'] + ':' + d['condition'] for d in s.depends_on)}",
        f"    S_BINDS={_array(spec for spec, _ in binds)}",
        f"    S_MKDIRS={_array(b.source for _, b in binds if b.create or b.kind in ('volume', 'scratch', 'tmpfs'))}",
        f"    S_FILLS={_array(item for b in s.binds if b.fill for item in (b.source, b.target))}",
        # scratch over an image's directory keeps what the image has there (nginx's log links to stdout)
        f"    S_KEEPS={_array(item for b in s.binds if b.kind == 'scratch' for item in (b.source, b.target))}",
        f"    S_MOUNT_POINTS={_array(mount_points)}",
        f"    S_HOST_PATHS={_array(i for b in s.binds if b.host_path for i in (b.source, b.target, str(int(b.create))))}",
        f"    S_SOCKETS={_array(f'{b.source}:{b.target}' for b in s.binds if b.socket)}",
        f"    S_EMPTY={_array(b.source for _, b in binds if b.kind in ('tmpfs', 'scratch'))}",
        f"    S_ENDPOINTS={_array(_endpoint(p) for p in s.ports)}",
        f"    S_FORWARDS={_array(i for p in s.ports if p.forward for i in (p.forward, _forward_target(p)))}",
        # for `port`: each published port as "CONTAINER ADDR:HOST" (HOST 0: a free port chosen at `up`)
        f"    S_PUBLISHED={_array(_published(p) for p in s.ports if p.published)}",
        # as written: where the tracer puts each privileged port (c2s-loopback --map)
        f"    S_PORT_MAP={_array(f'{p.host}:{p.traced_port}' for p in s.ports if p.traced_port)}",
        # as written: its compose networks, where they reach less than all (c2s-loopback --reach, --internal)
        f"    S_REACH_LIMITED={1 if s.reach_limited else 0} S_REACH={_q(reach)} "
        f"S_INTERNAL={0 if s.reach.get('outside', True) else 1}",
        f"    S_HIDDEN_NAMES={_array(hidden)}",  # ADDR:ALIAS: a peer's alias on a network it is not on
        f"    S_NETWORKS={_q(','.join(s.reach.get('networks', [])) or s.reach.get('mode', ''))}",
        f"    S_HEALTH={_array(health['test'] if health else [])}",
        f"    S_CHECK={_array(s.check)}",  # its adapter's: why its program would not start
        # three words a pre_start step: its image key, its env file, its fingerprint
        f"    S_PRE_START={_array(w for p in s.pre_start for w in (p.image, p.env_file, p.fingerprint))}",
    ]
    if health:
        lines += [f"    S_HEALTH_INTERVAL={health['interval']} S_HEALTH_TIMEOUT={health['timeout']} "
                  f"S_HEALTH_RETRIES={health['retries']}",
                  f"    S_HEALTH_START_PERIOD={health['start_period']} S_HEALTH_START_INTERVAL={health['start_interval']}"]
    else:
        lines.append("    S_HEALTH_INTERVAL=30 S_HEALTH_TIMEOUT=30 S_HEALTH_RETRIES=3 S_HEALTH_START_PERIOD=0 "
                     "S_HEALTH_START_INTERVAL=5")
    lines += [f"    S_STOP_SIGNAL={_q(s.stop_signal)}", f"    S_STOP_GRACE={int(s.stop_grace_period)}", "}"]
    return lines


def render_runner(plan: Plan) -> str:
    """run.sh: the project as bash data (quoted by construction), then the engine (run/, joined)."""
    # a function per service, named by its position: `a-b` and `a_b` must not share one
    functions = [f"{i}_{re.sub(r'[^A-Za-z0-9_]', '_', s.name)}" for i, s in enumerate(plan.services)]
    def entry_points(of: Plan) -> List[str]:
        return [f"{e['service']} {e['scheme']} {e['address']} {e['port']} {e['container']} {e['path']}" for e in of.entry_points]
    out = ["#!/usr/bin/env bash",
           f"# {_oneline(plan.project)}: compose2sif runner. Generated by `compose2sif convert` from",
           "#   " + "\n#   ".join(_oneline(f) for f in plan.compose_files),
           _HELP + f"PROJECT={_q(plan.project)}",
           f'STATE="$HERE/{plan.state_dir}"',
           'RUNDIR="$STATE/run"',
           f"SERVICES={_array(s.name for s in plan.services)}",
           "# services of several replicas (deploy.replicas): each one's NAME-1..NAME-N",
           "declare -A REPLICAS=(" + " ".join(f"[{_q(name)}]={_q(' '.join(replicas))}"
                                              for name, replicas in _replicas(plan).items()) + ")",
           "# where the tracer puts privileged ports (each service on its own address): the block's top half",
           f"LOOPBACK_BLOCK={plan.port_base + PORT_BLOCK // 2}-{plan.port_base + PORT_BLOCK - 1}",
           "# the node as services on their own addresses reach it (host.docker.internal): forwarders serve",
           "# every port published on all interfaces there too",
           f"GATEWAY={gateway_address(plan.address_block)}",
           "# a network_mode: host service beside own addresses: their binds share ports with its wildcard ones",
           f"SHARE_PORTS={1 if any(s.host_network for s in plan.services) else 0}",
           "# the project's DNS server, where the tracer sends queries to Docker's 127.0.0.11 (run/lib/dns.sh),",
           "# and DNS_PORT on its own address, a service's own one where its networks reach less",
           f"DNS_PORT={dns_port(plan.port_base)}",
           'DNS_ENDPOINT="$GATEWAY:$DNS_PORT"',
           f"LEVELS=({' '.join(str(s.level) for s in plan.services)})",
           f"MAX_LEVEL={max((s.level for s in plan.services), default=0)}",
           f"IMAGES={_array(plan.images)}",
           f"PULLED={_array(k for k, v in plan.images.items() if v.kind == 'docker')}"
           "  # images run as they are in a registry",
           f"PLAIN_REGISTRIES={_array(sorted({m['mirror'].split('/')[0] for m in plan.registry_mirrors if m['plain_http']}))}"
           "  # mirrors that speak plain HTTP (--registry-mirror http://...)",
           "# web fronts `up` points people at: SERVICE SCHEME ADDRESS PORT CONTAINER-PORT PATH (port 0: a free one)",
           f"ENTRY_POINTS={_array(entry_points(plan))}",
           *([f"FALLBACK_ENTRY_POINTS={_array(entry_points(plan.fallback))}  # (up uses them where it falls back)"]
             if plan.fallback is not None else []),
           "",
           "# ---- the services (generated) ---------------------------------------------------------------"]
    if plan.fallback is not None or plan.fallback_refusal:
        out += ["# where services cannot get a loopback of their own, the line `up` refuses the project with",
                f"FALLBACK_REFUSAL={_q(plan.fallback_refusal)}"]
    for s, fn in zip(plan.services, functions):
        lines = _service_function(s, fn, own_address(plan, s), _reach_addresses(plan, s), _hidden_names(plan, s))
        if plan.fallback is not None:
            theirs = plan.fallback.service(s.name)
            lines = _by_isolation(lines, _service_function(theirs, fn, own_address(plan.fallback, theirs)))
        out += lines
    out += ["", "load_service() {", '    [ -n "$ISOLATION" ] || isolation_mode  # which data: as written, or the fallback\'s',
            '    case "$1" in']
    out += [f"        {_q(s.name)}) svc_{fn} ;;" for s, fn in zip(plan.services, functions)]
    out += ['        *) die "no such service: $1 (services: ${SERVICES[*]})" ;;', "    esac",
            "    isolated_endpoints  # where the tracer puts them, in intercept mode (run/lib/isolation.sh)", "}", "",
            "# ---- the engine (the same for every project: run/lib, run/cmd, run/main.sh) ----------------", ""]
    return "\n".join(out) + engine()


def _replicas(plan: Plan) -> Dict[str, List[str]]:
    found: Dict[str, List[str]] = {}
    for s in plan.services:
        if s.replica_of:
            found.setdefault(s.replica_of, []).append(s.name)
    return {name: sorted(names, key=lambda n: int(n.rsplit("-", 1)[1])) for name, names in found.items()}


def _by_isolation(written: List[str], fallback: List[str]) -> List[str]:
    """One service function from two: the lines alike, then the ones that differ under an `if` on
    the isolation `up` chose (run/lib/isolation.sh): as written under the tracer, else the fallback's."""
    head, body, tail = written[0], written[1:-1], written[-1]
    theirs = fallback[1:-1]
    alike = [line for line in body if line in theirs]
    return ([head, *alike, '    if [ "$ISOLATION" = intercept ]; then']
            + ["    " + line for line in body if line not in alike] + ["    else"]
            + ["    " + line for line in theirs if line not in alike] + ["    fi", tail])


def own_address(plan: Plan, service: ServicePlan) -> str:
    """The address its name has in the hosts file, where the tracer gives it a loopback of its own
    (also where the plan could not tell it an address)."""
    return next((address for address, names in plan.hosts if service.name in names), service.address)


def hosts_names(plan: Plan) -> str:
    """Each service's names at its own address (the plan's hosts lines)."""
    return "".join(f"{address} {' '.join(names)}\n" for address, names in plan.hosts if names)


def _tls_files(plan: Plan, out_dir: str) -> None:
    """The certificate and key for --tls: the given files, or a self-signed pair made once."""
    import shutil
    import socket
    import subprocess
    import tempfile
    names = (plan.tls["cert"], plan.tls["key"])
    if plan.tls["source"]:
        for source, name, mode in zip(plan.tls["source"], names, (0o644, 0o600)):
            try:
                with open(source, encoding="utf-8") as fh:
                    text = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ComposeError(f"--tls-cert/--tls-key: cannot read {source}: {exc}") from None
            _write(out_dir, name, text, mode)
        return
    if all(os.path.isfile(os.path.join(out_dir, n)) and not os.path.islink(os.path.join(out_dir, n)) for n in names):
        return
    if shutil.which("openssl") is None:
        raise ComposeError("--tls needs openssl to make a self-signed certificate (or pass --tls-cert and --tls-key)")
    host = socket.getfqdn()
    with tempfile.TemporaryDirectory() as work:  # openssl writes where it is told: a private place first
        cert, key = os.path.join(work, "cert"), os.path.join(work, "key")
        proc = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "825",
                               "-subj", f"/CN={host}", "-addext", f"subjectAltName=DNS:{host},DNS:localhost,IP:127.0.0.1",
                               "-keyout", key, "-out", cert], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ComposeError(f"openssl could not make a certificate: {proc.stderr.strip().splitlines()[-1:]}")
        for path, name, mode in ((cert, names[0], 0o644), (key, names[1], 0o600)):
            with open(path, encoding="utf-8") as fh:
                _write(out_dir, name, fh.read(), mode)


def _is_ours(out_dir: str) -> bool:
    try:
        with open(os.path.join(out_dir, "plan.json"), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "services" in data and "state_dir" in data


def check_output_dir(out_dir: str) -> None:
    """Only an output directory of ours, an empty one or a new one is written to: `-o ~` must not
    overwrite or chmod what is there."""
    if os.path.islink(out_dir):
        raise ComposeError(f"output directory {out_dir} is a symbolic link; give the directory it points to")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ComposeError(f"output directory {out_dir} exists and is not a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not _is_ours(out_dir):
        raise ComposeError(f"output directory {out_dir} exists and is not a compose2sif output directory "
                           "(it has no plan.json of ours); choose another -o or empty it")


_BIND_SEPARATORS = ",:^"  # what apptainer's --bind splits a bind specification on


def check_binds(plan: Plan, out_dir: str) -> None:
    """Bind paths reach apptainer's --bind, which has separators of its own; the project's volumes
    and scratch directories stay inside the output directory (a `..` in a volume's subpath)."""
    for service in plan.services:
        for bind in service.binds:
            for path in (bind.source, bind.target):
                odd = sorted(set(path) & set(_BIND_SEPARATORS))
                if odd:
                    raise ComposeError(f"{path!r} contains {', '.join(map(repr, odd))}, which apptainer's --bind "
                                       "reads as a separator; rename the path", path=f"services.{service.name}.volumes")
            if bind.kind in ("volume", "scratch", "tmpfs"):
                inside = os.path.normpath(os.path.join(out_dir, plan.state_dir))
                if not os.path.normpath(os.path.join(out_dir, bind.source)).startswith(inside + os.sep):
                    raise ComposeError(f"{bind.target}: {bind.source!r} leads outside {plan.state_dir}/ of the output "
                                       "directory (a `..` in a subpath?); refused", path=f"services.{service.name}.volumes")


def write(plan: Plan, out_dir: str) -> None:
    """Write every file of the plan into out_dir."""
    check_output_dir(out_dir)
    check_binds(plan, out_dir)
    os.makedirs(out_dir, mode=0o700, exist_ok=True)
    os.chmod(out_dir, 0o700)
    os.close(_open_dir(out_dir, ["sif"]))  # where run.sh writes: a real directory, not a planted link
    if os.path.islink(os.path.join(out_dir, plan.state_dir)):
        raise ComposeError(f"{os.path.join(out_dir, plan.state_dir)} is a symbolic link; compose2sif does not "
                           "follow links in its output directory (remove it)")
    if plan.tls:
        _tls_files(plan, out_dir)
    for image in plan.images.values():
        _write(out_dir, image.definition, image.text, 0o644)
    for service in plan.services + (plan.fallback.services if plan.fallback else []):
        base = service.env_file[:-len(".env")]
        _write(out_dir, service.env_file, env_file_text(service))
        _write(out_dir, base + ".eval.env", env_file_text(service, evaluated=True))
        if service.probe_environment:  # the probe's own environment: the service's, and the password its client reads
            _write(out_dir, base + ".health.env", env_file_text(service, extra=service.probe_environment))
            _write(out_dir, base + ".health.eval.env",
                   env_file_text(service, evaluated=True, extra=service.probe_environment))
        for step in service.pre_start:  # a step is its service with its own environment and command
            as_run = dataclasses.replace(service, name=f"{service.name} pre_start[{step.index}]",
                                         environment=step.environment, launch=step.launch, workdir=step.workdir)
            _write(out_dir, step.env_file, env_file_text(as_run))
            _write(out_dir, step.env_file[:-len(".env")] + ".eval.env", env_file_text(as_run, evaluated=True))
    for path, content in {**plan.configs, **(plan.fallback.configs if plan.fallback else {})}.items():
        _write(out_dir, path, content)
    if plan.fallback is not None:
        _write(out_dir, "fallback/hosts.names", hosts_names(plan.fallback), 0o644)
        _write(out_dir, "fallback/plan.json", json.dumps(plan.fallback.to_json(), indent=2) + "\n", 0o644)
    if plan.generated_secrets:
        _write(out_dir, SECRETS_FILE, file_text(plan.generated_secrets), 0o600)
    _write(out_dir, "hosts.names", hosts_names(plan), 0o644)
    built = helpers.files(forwarder=any(p.forward for s in plan.services for p in s.ports))
    for path, content in built.items():  # bin/ARCH/c2s-forward, bin/ARCH/c2s-loopback, bin/helpers.json
        _write(out_dir, path, content, 0o644 if path.endswith(".json") else 0o755)
    if not built and helpers.missing_line() not in plan.warnings:
        plan.warnings.append(helpers.missing_line())
    _write(out_dir, "run.sh", render_runner(plan), 0o755)
    _write(out_dir, "plan.json", json.dumps(plan.to_json(), indent=2) + "\n", 0o644)

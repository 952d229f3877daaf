"""nginx: its config files, rendered on the host.

Inside an Apptainer instance the image is read-only, so nginx's entrypoint cannot write the
configs it renders from templates. We do that work here, with the official image's rules
(``envsubst`` over the variables the service defines, ``/etc/nginx/templates/*.template`` to
``/etc/nginx/conf.d/*``), and bind the results read-only. Every config we render or copy also
follows the plan: each ``listen`` gets its port's planned address and port, and ``proxy_pass``/
``upstream`` references to other services their planned ports.
"""
from __future__ import annotations

import itertools
import os
import re
from typing import Dict, List, Optional, Set, Tuple

from compose2sif.adapters.base import Adapter, Draft
from compose2sif.errors import ComposeError
from compose2sif.types import Bind, Knob


_LISTEN = re.compile(r"^\s*listen\s+[^;]*\d+[^;]*;", re.MULTILINE)
_PROGRAM = re.compile(r"(^|[\s/;&|'\"])nginx($|[\s;&|'\"])")


class Nginx(Adapter):
    def configurable(self, service) -> bool:
        """A config under /etc/nginx, or a bound file with nginx `listen` directives (a template
        directory the command copies in): either way we render what it listens on."""
        return any(m.type == "bind" and m.target.startswith("/etc/nginx") for m in service.mounts) or \
            any(_listens(path) for path, _ in _bound_configs(_binds(service)))

    def fix(self, service, port: int) -> Optional[str]:
        """nginx reads its ports from its config, never a variable: bind one, and it is rendered."""
        return (f"fix: bind its config into service {service.name!r} (the image's own is "
                f"/etc/nginx/conf.d/default.conf, `listen {port};`): add to its volumes "
                f"`./{service.name}-default.conf:/etc/nginx/conf.d/default.conf:ro`, and compose2sif renders where it "
                "listens")

    def shown_by(self, service) -> bool:
        """nginx whatever the image is called: its config mounted under /etc/nginx, `nginx` run by
        the command or entrypoint, or a bound template directory of nginx `listen` directives."""
        words = " ".join((service.entrypoint or []) + (service.command or []))
        return any(m.type == "bind" and m.target.startswith("/etc/nginx") for m in service.mounts) or \
            _PROGRAM.search(words) is not None or \
            any(t.endswith(SUFFIX) and _listens(path) for path, t in _bound_configs(_binds(service)))

    def render_environment(self, draft: Draft) -> Dict[str, str]:
        """The variables templates are rendered with (the official image: the service's own)."""
        return draft.environment

    def finish(self, draft: Draft) -> None:
        rendered, draft.binds, warnings = render_configs(draft, self.render_environment(draft))
        draft.warnings += warnings
        draft.configs.update(rendered)
        if draft.tls:
            draft.binds = _add_tls(draft, self.entry_port, self.tls_port)

    def names_not_hosts(self, text: str) -> Set[str]:
        """`upstream NAME {}` blocks: `proxy_pass http://NAME` means the block, not a host."""
        return set(re.findall(r"\bupstream\s+([\w.-]+)\s*\{", text))


ADAPTER = Nginx(
    family="nginx",
    images=r"(^|/)nginx(-unprivileged)?$|openresty",
    ports={80: Knob("config", "nginx listen"), 443: Knob("config", "nginx listen")},
    address=Knob("config", "nginx listen"),
    per_port_address=True,
    entry_path="/",
    entry_port=80,
    tls_port=443,
    writable=("/var/cache/nginx", "/var/run", "/run", "/var/log/nginx", "/var/lib/nginx"),
    workdir="/",  # the image's WORKDIR
)


def _binds(service) -> List[Tuple[str, str]]:
    return [(m.source, m.target) for m in service.mounts if m.type == "bind" and m.source]


def _bound_configs(binds: List[Tuple[str, str]]) -> List[Tuple[str, str]]:
    """(host path, path in the instance) of the `.conf` and `.template` files these binds bring in."""
    found: List[Tuple[str, str]] = []
    for source, target in binds:
        if os.path.isfile(source):
            found.append((source, target))
        elif os.path.isdir(source):
            try:  # the first 200 names: a bound data directory may hold millions
                with os.scandir(source) as entries:
                    names = sorted(e.name for e in itertools.islice(entries, 200))
            except OSError:
                continue
            found += [(os.path.join(source, n), os.path.join(target, n)) for n in names]
    return [(p, t) for p, t in found if p.endswith((".conf", SUFFIX)) and os.path.isfile(p)]


def _listens(path: str) -> bool:
    try:
        if os.path.getsize(path) > 256 * 1024:
            return False
        with open(path, encoding="utf-8", errors="replace") as fh:
            return _LISTEN.search(fh.read()) is not None
    except OSError:
        return False


TEMPLATE_DIR = "/etc/nginx/templates"
OUTPUT_DIR = "/etc/nginx/conf.d"
SUFFIX = ".template"


def envsubst(text: str, env: Dict[str, str]) -> str:
    """`envsubst "$defined_envs"`: replace $VAR and ${VAR} for defined variables only."""
    return re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))",
                  lambda m: env.get(m.group(1) or m.group(2), m.group(0)), text)


def rewrite_ports(text: str, draft: Draft) -> str:
    """Apply the plan to one nginx config: listen directives, then references to other services."""
    def listen(m: "re.Match[str]") -> str:
        address, port, rest = m.group(2), int(m.group(3)), m.group(4)
        endpoint = draft.endpoints.get(port)
        if endpoint is None:
            return m.group(0)
        if address and address.startswith("["):
            if endpoint.address in ("0.0.0.0", "::"):
                return f"{m.group(1)}[::]:{endpoint.host}{rest}"
            return f"# {m.group(0)}  (compose2sif: this server listens on {endpoint.address} only)"
        directive = f"{m.group(1)}{endpoint.address}:{endpoint.host}{rest}"
        if endpoint.address not in ("0.0.0.0", "::", draft.own_address):  # published on one address:
            directive += f" {m.group(1)}{draft.own_address}:{endpoint.host}{rest}"  # its names point here
        return directive

    text = re.sub(r"(\blisten\s+)(?:(\[[^\]]*\]|[\w.-]+):)?(\d+)([^;]*;)", listen, text)
    text = draft.refs.rewrite(text, draft.name)
    return _without_docker_resolver(text, draft)


def _without_docker_resolver(text: str, draft: Draft) -> str:
    """`resolver 127.0.0.11` is Docker's DNS, and nginx resolves a variable upstream (`set $u
    api:5001; proxy_pass http://$u;`) only through a resolver, never /etc/hosts. Where each service
    runs under its tracer (``draft.docker_dns``), the project's DNS server answers there (run/lib/dns.sh)
    and the config stays as written. In the plan-time fallback nothing does: such upstreams become
    the planned address and port, which need no resolver."""
    if "127.0.0.11" not in text or draft.docker_dns:
        return text
    network = draft.refs.network

    def literal(m: "re.Match[str]") -> str:
        service = draft.refs.service_of.get(m.group(2))
        if service is None or network is None:
            draft.warnings.append(f"service {draft.name!r}: nginx upstream {m.group(2)}:{m.group(3)} is no service "
                                  "of this project; requests for it will fail")
            return m.group(0)
        port = draft.refs.port_of(m.group(2), int(m.group(3))) or int(m.group(3))
        return f"{m.group(1)}{network.names_address(service)}:{port};"

    text = re.sub(r"(\bset\s+\$\w+\s+)([A-Za-z_][\w.-]*):(\d+)\s*;", literal, text)
    return re.sub(r"[ \t]*\bresolver\s+127\.0\.0\.11\b[^;]*;[ \t]*\n?", "", text)


def _render_file(path: str, draft: Draft, env: Dict[str, str], template: bool) -> str:
    where = f"services.{draft.service.name}.volumes"
    if not os.path.isfile(path):  # a FIFO or a device would block or never end
        raise ComposeError(f"{path}: mounted into nginx's configuration, but not a regular file", path=where)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read().replace("\r\n", "\n")
    except OSError as exc:
        raise ComposeError(f"{path}: cannot read it ({exc.strerror})", path=where) from None
    if template:
        text = envsubst(text, env)
    return rewrite_ports(text, draft)


def render_configs(draft: Draft, env: Dict[str, str]) -> Tuple[Dict[str, str], List[Bind], List[str]]:
    """Render and rewrite the nginx configs mounted into the service.

    Returns (files: path in the output dir -> content, the service's new binds, warnings). Each
    file lives at ``config/<service>/root/<its path in the instance>``; a mounted directory, and
    ``/etc/nginx/conf.d`` when templates were rendered into it, is bound as a directory.
    """
    service, binds = draft.service, draft.binds
    root = f"config/{service.name}/root"
    targets: Dict[str, str] = {}         # path in the instance -> content
    bound_dirs: List[str] = []
    warnings: List[str] = []
    kept = []
    for bind in binds:
        if bind.kind == "bind" and not bind.target.startswith("/etc/nginx"):
            # a config bound elsewhere that the command copies in: each file with `listen` gets a
            # rewritten copy bound over it (no envsubst: the command does its own)
            for path, target in _bound_configs([(bind.source, bind.target)]):
                if _listens(path):
                    targets[target] = _render_file(path, draft, env, template=False)
        if bind.kind != "bind" or not bind.target.startswith("/etc/nginx"):
            kept.append(bind)
            continue
        if os.path.isdir(bind.source):
            bound_dirs.append(bind.target)
            for folder, _, files in os.walk(bind.source):
                for file in sorted(files):
                    path = os.path.join(folder, file)
                    _add(targets, path, os.path.join(bind.target, os.path.relpath(path, bind.source)), draft, env)
        elif os.path.isfile(bind.source):
            if not _add(targets, bind.source, bind.target, draft, env):
                kept.append(bind)
        else:
            warnings.append(f"service {service.name!r}: {bind.source} (mounted at {bind.target}) does not exist; "
                            "no nginx config rendered from it")
            kept.append(bind)
    if any(t.startswith(OUTPUT_DIR + "/") for t in targets) and OUTPUT_DIR not in bound_dirs:
        bound_dirs.append(OUTPUT_DIR)
    files = {f"{root}{target}": content for target, content in targets.items()}
    for directory in bound_dirs:
        kept.append(Bind(f"{root}{directory}", directory, True, "config", False))
    for target in sorted(targets):
        if not any(target.startswith(d.rstrip("/") + "/") for d in bound_dirs):
            kept.append(Bind(f"{root}{target}", target, True, "config", False))
    return files, kept, warnings


def _add(targets: Dict[str, str], path: str, target: str, draft: Draft, env: Dict[str, str]) -> bool:
    if target.endswith(SUFFIX):
        rendered = target[: -len(SUFFIX)]
        if target.startswith(TEMPLATE_DIR + "/"):
            rendered = OUTPUT_DIR + rendered[len(TEMPLATE_DIR):]
        targets[rendered] = _render_file(path, draft, env, template=True)
        return True
    if path.endswith(".conf") or os.path.basename(target) in ("nginx.conf", "default.conf"):
        targets[target] = _render_file(path, draft, env, template=False)
        return True
    return False


TLS_DIR = "/etc/compose2sif/tls"


def tls_config(address: str, tls_port: int, upstream: str) -> str:
    """A TLS server in front of the service's own plain HTTP listener."""
    return f"""# compose2sif --tls: HTTPS on {address}:{tls_port}, forwarded to this nginx's own HTTP listener
map $http_upgrade $c2s_connection {{
    default upgrade;
    ''      close;
}}
server {{
    listen {address}:{tls_port} ssl;
    ssl_certificate {TLS_DIR}/cert.pem;
    ssl_certificate_key {TLS_DIR}/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    client_max_body_size 0;
    location / {{
        proxy_pass http://{upstream};
        proxy_http_version 1.1;
        proxy_set_header Host $host;
        proxy_set_header X-Forwarded-Proto https;
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        proxy_set_header Upgrade $http_upgrade;
        proxy_set_header Connection $c2s_connection;
        proxy_read_timeout 3600s;
    }}
}}
"""


def _add_tls(draft: Draft, http_port: int, tls_port: int) -> List[Bind]:
    """HTTPS for an nginx service: a TLS server on its TLS_PORT plan, forwarding to its HTTP_PORT."""
    http, tls = draft.endpoints.get(http_port), draft.endpoints.get(tls_port)
    if http is None or tls is None:
        draft.warnings.append(f"service {draft.name!r}: --tls needs nginx listening on port {http_port}; "
                              "HTTPS not added")
        return draft.binds
    published = http.published or tls.published
    address = tls.address if tls.published else ("0.0.0.0" if published else http.address)
    tls.address, tls.published = address, published
    draft.serves_https = True
    extra = [Bind("tls", TLS_DIR, True, "config", False)]
    conf_d = next((b for b in draft.binds if b.target == "/etc/nginx/conf.d" and b.kind == "config"), None)
    upstream = http.address if http.address not in ("0.0.0.0", "::") else "127.0.0.1"
    config = tls_config(address, tls.host, f"{upstream}:{http.host}")
    if conf_d is not None:  # our rendered conf.d is bound: the TLS server goes into it
        draft.configs[f"{conf_d.source}/compose2sif-tls.conf"] = config
    else:
        path = f"config/{draft.name}/tls/compose2sif-tls.conf"
        draft.configs[path] = config
        extra.append(Bind(path, "/etc/nginx/conf.d/compose2sif-tls.conf", True, "config", False))
    return draft.binds + extra

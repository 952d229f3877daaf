"""nginx config files, rendered on the host.

Inside an Apptainer instance the image is read-only, so nginx's entrypoint cannot write the
configs it renders from templates. We do that work here, with the official image's rules
(``envsubst`` over the variables the service defines, ``/etc/nginx/templates/*.template`` to
``/etc/nginx/conf.d/*``), and bind the results read-only. Every config we render or copy also
follows the port plan: ``listen`` uses the planned address and port, and ``proxy_pass``/``upstream``
references to other services use their planned ports.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Tuple

TEMPLATE_DIR = "/etc/nginx/templates"
OUTPUT_DIR = "/etc/nginx/conf.d"
SUFFIX = ".template"


def envsubst(text: str, env: Dict[str, str]) -> str:
    """`envsubst "$defined_envs"`: replace $VAR and ${VAR} for defined variables only."""
    return re.sub(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))",
                  lambda m: env.get(m.group(1) or m.group(2), m.group(0)), text)


def rewrite_ports(text: str, ports, refs, service: str) -> str:
    """Apply the port plan to one nginx config."""
    def listen(m: "re.Match[str]") -> str:
        address, port, rest = m.group(2), int(m.group(3)), m.group(4)
        plan = ports.get(port)
        if plan is None:
            return m.group(0)
        if address and address.startswith("["):
            address = "[::1]" if plan.address == "127.0.0.1" else "[::]"
        else:
            address = plan.address
        return f"{m.group(1)}{address}:{plan.host}{rest}"

    text = re.sub(r"(\blisten\s+)(?:(\[[^\]]*\]|[\w.-]+):)?(\d+)([^;]*;)", listen, text)
    text = refs.rewrite(text, service)

    def bare(m: "re.Match[str]") -> str:
        port = refs.port_of(m.group(2), 80 if m.group(1) == "http" else 443)
        return f"{m.group(1)}://{m.group(2)}:{port}{m.group(3)}" if port else m.group(0)

    return re.sub(r"\b(https?)://([A-Za-z0-9_.-]+)([/;\s])", bare, text)


def _render_file(path: str, env, ports, refs, service: str, template: bool) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read().replace("\r\n", "\n")
    if template:
        text = envsubst(text, env)
    return rewrite_ports(text, ports, refs, service)


def render_configs(service, env: Dict[str, str], ports, refs, binds) -> Tuple[Dict[str, str], List, List[str]]:
    """Render and rewrite the nginx configs mounted into ``service``.

    Returns (files: path in the output dir -> content, the service's new binds, warnings). Each
    file lives at ``config/<service>/root/<its path in the instance>``; a mounted directory, and
    ``/etc/nginx/conf.d`` when templates were rendered into it, is bound as a directory.
    """
    from compose2sif.plan import Bind
    root = f"config/{service.name}/root"
    targets: Dict[str, str] = {}         # path in the instance -> content
    bound_dirs: List[str] = []
    warnings: List[str] = []
    kept = []
    for bind in binds:
        if bind.kind != "bind" or not bind.target.startswith("/etc/nginx"):
            kept.append(bind)
            continue
        if os.path.isdir(bind.source):
            bound_dirs.append(bind.target)
            for folder, _, files in os.walk(bind.source):
                for file in sorted(files):
                    path = os.path.join(folder, file)
                    _add(targets, path, os.path.join(bind.target, os.path.relpath(path, bind.source)),
                         env, ports, refs, service.name)
        elif os.path.isfile(bind.source):
            if not _add(targets, bind.source, bind.target, env, ports, refs, service.name):
                kept.append(bind)
        else:
            warnings.append(f"service {service.name!r}: {bind.source} (mounted at {bind.target}) does not exist; "
                            "no nginx config rendered from it")
            kept.append(bind)
    if any(t.startswith(OUTPUT_DIR + "/") for t in targets) and OUTPUT_DIR not in bound_dirs:
        bound_dirs.append(OUTPUT_DIR)
    if any("resolver 127.0.0.11" in content for content in targets.values()):
        warnings.append(f"service {service.name!r}: nginx config uses Docker's DNS (resolver 127.0.0.11), which "
                        "does not exist here; names resolve through /etc/hosts only at startup")
    files = {f"{root}{target}": content for target, content in targets.items()}
    for directory in bound_dirs:
        kept.append(Bind(f"{root}{directory}", directory, True, "config", False))
    for target in sorted(targets):
        if not any(target.startswith(d.rstrip("/") + "/") for d in bound_dirs):
            kept.append(Bind(f"{root}{target}", target, True, "config", False))
    return files, kept, warnings


def _add(targets, path, target, env, ports, refs, service) -> bool:
    if target.endswith(SUFFIX):
        rendered = target[: -len(SUFFIX)]
        if target.startswith(TEMPLATE_DIR + "/"):
            rendered = OUTPUT_DIR + rendered[len(TEMPLATE_DIR):]
        targets[rendered] = _render_file(path, env, ports, refs, service, template=True)
        return True
    if path.endswith(".conf") or os.path.basename(target) in ("nginx.conf", "default.conf"):
        targets[target] = _render_file(path, env, ports, refs, service, template=False)
        return True
    return False


TLS_DIR = "/etc/compose2sif/tls"


def tls_config(address: str, tls_port: int, http_port: int) -> str:
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
        proxy_pass http://127.0.0.1:{http_port};
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

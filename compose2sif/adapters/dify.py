"""Dify (langgenius/dify-*): its own images, and the Dify preset for the general images its compose
uses in its own way (nginx and squid through entrypoint scripts copied into the image, a busybox
one-shot that chowns). The preset is on when a project has a langgenius/dify-* image.

What Dify's entrypoints do is done here at convert time, so nothing is written into an image:
- nginx (docker/nginx/docker-entrypoint.sh): HTTPS_CONFIG from https.conf.template when
  NGINX_HTTPS_ENABLED=true, ACME_CHALLENGE_LOCATION when the certbot challenge is on, envsubst of
  the defined variables over /etc/nginx/{nginx,proxy}.conf.template and conf.d/*.template, then
  `nginx -g 'daemon off;'`;
- squid (docker/ssrf_proxy/*entrypoint.sh): envsubst over /etc/squid/*.template, the private
  allow-list from SSRF_PROXY_ALLOW_PRIVATE_IPS/_DOMAINS, then squid in the foreground.
"""
import os
import re
from typing import Dict, List

from compose2sif.adapters import nginx
from compose2sif import secret_rules as generated
from compose2sif.adapters.base import Adapter, Draft, Preset
from compose2sif.secret_rules import PublicDefault, rule_of
from compose2sif.types import Bind, Knob

PRESET = "dify"
MOUNTED_ENTRYPOINT = "/docker-entrypoint-mount.sh"

# Dify's secrets: the public default of each (docker-compose.yaml and .env.example of 1.17), and
# the rule its reader checks (tests/test_dify.py checks generated values against each reader's code).
_HEADER = dict(check=generated.header_token, why="printable ASCII without spaces, the same on both sides of an "
                                                  "HTTP header")
SECRETS = {
    # the Flask app's session and encryption key (any non-empty string); Dify 1.15+ leaves it empty
    # in .env.example and then keeps a key of its own in its storage volume, which is left alone
    "SECRET_KEY": PublicDefault("sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U", rule_of(
        "sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U", check=generated.nonempty, reader="api",
        why="a non-empty string", empty_is_own=True)),
    # PostgreSQL's superuser password: set once when the database is initialised
    # (api quotes it into its database URL)
    "DB_PASSWORD": PublicDefault("difyai123456", rule_of(
        "difyai123456", reader="db_postgres", keep_stored=True, check=generated.nonempty,
        why="a non-empty password")),
    # also written into redis:// URLs (CELERY_BROKER_URL, DIFY_AGENT_REDIS_URL) as it is
    "REDIS_PASSWORD": PublicDefault("difyai123456", rule_of(
        "difyai123456", reader="redis", why="characters that need no quoting inside a redis:// URL")),
    # X-Api-Key from api (CODE_EXECUTION_API_KEY) to dify-sandbox (API_KEY, config.yaml app.key)
    "SANDBOX_API_KEY": PublicDefault("dify-sandbox", rule_of("dify-sandbox", reader="sandbox", **_HEADER)),
    # X-Api-Key from api and agent_backend to plugin_daemon (SERVER_KEY)
    "PLUGIN_DAEMON_KEY": PublicDefault("lYkiYYT6owG+71oLerGzA7GXCgOT++6ovaezWAjpCjf+Sjc3ZtU+qUEi", rule_of(
        "lYkiYYT6owG+71oLerGzA7GXCgOT++6ovaezWAjpCjf+Sjc3ZtU+qUEi", reader="plugin_daemon", **_HEADER)),
    # X-Inner-Api-Key from plugin_daemon and agent_backend to api (INNER_API_KEY_FOR_PLUGIN)
    "PLUGIN_DIFY_INNER_API_KEY": PublicDefault("QaHbTe77CtuXmsfyhR7+vRjI/+XbV1AaFy691iy+kGDv2Jvy0/eAh8Y1", rule_of(
        "QaHbTe77CtuXmsfyhR7+vRjI/+XbV1AaFy691iy+kGDv2Jvy0/eAh8Y1", reader="api", **_HEADER)),
    # dify-agent's decode_server_secret_key: unpadded base64url of exactly 32 bytes, checked at start
    "DIFY_AGENT_SERVER_SECRET_KEY": PublicDefault("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY", generated.Rule(
        length=32, decoded=True, check=generated.base64url_bytes(32), reader="agent_backend",
        why="unpadded base64url text that decodes to exactly 32 bytes")),
    # Bearer token from api and worker (AGENT_BACKEND_API_TOKEN) to agent_backend
    "DIFY_AGENT_API_TOKEN": PublicDefault("dify-agent-run-token-for-dev-only", rule_of(
        "dify-agent-run-token-for-dev-only", reader="agent_backend", **_HEADER)),
    # Bearer token from agent_backend to local_sandbox (shellctl); empty means "no authentication"
    "DIFY_AGENT_LOCAL_SANDBOX_AUTH_TOKEN": PublicDefault("", generated.Rule(reader="local_sandbox", **_HEADER)),
    # an entry of Weaviate's comma-separated key list, and api's WEAVIATE_API_KEY
    "WEAVIATE_AUTHENTICATION_APIKEY_ALLOWED_KEYS": PublicDefault("WVF5YThaHlkYwhGUSmCRgsX3tD5ngdN8pkih", rule_of(
        "WVF5YThaHlkYwhGUSmCRgsX3tD5ngdN8pkih", reader="weaviate", why="one key without commas",
        check=lambda value: generated.header_token(value) and "," not in value)),
}
# a project is Dify's when one of its images is; its users copy .env.example to .env first
SETUP = Preset(PRESET, "Dify", image_prefix="langgenius/dify-", secrets=SECRETS, dotenv_example=True)

# Where a browser reaches Dify: settings that hold a URL of Dify's nginx as the browser sees it.
BROWSER_URLS = ("CONSOLE_API_URL", "CONSOLE_WEB_URL", "SERVICE_API_URL", "APP_API_URL", "APP_WEB_URL", "FILES_URL",
                "TRIGGER_URL", "ENDPOINT_URL_TEMPLATE", "NEXT_PUBLIC_SOCKET_URL")


class DifyApp(Adapter):
    """Dify's own images (api/worker, web, plugin daemon, agent backend, sandbox): each gets Dify's
    .env through env_file, with its browser-facing URLs. Those in .env.example name nginx as
    Docker publishes it (`http://localhost`, `ws://localhost`: port 80); under compose2sif a
    browser reaches nginx through the SSH tunnel `up` prints, at http://localhost:PORT with PORT
    nginx's planned port. Such URLs are rewritten to that port; the warning says so."""

    def finish(self, draft: Draft) -> None:
        _browser_urls(draft)


def _browser_urls(draft: Draft) -> None:
    network = draft.refs.network
    if network is None:
        return
    # Docker: "80:80", "443:443"; a browser reaches the published port (a forwarder's, where one serves it)
    fronts = {str(e.container): int(e.forward.rsplit(":", 1)[1]) if e.forward else e.host
              for service in sorted(network.endpoints)
              for e in network.endpoints[service].values() if e.published and e.container in (80, 443)}
    ports = set()
    for key in BROWSER_URLS:
        match = re.match(r"^(?P<scheme>https?|wss?)://(?:localhost|127\.0\.0\.1)(?::(?P<port>\d+))?(?P<rest>[/?#].*)?$",
                         draft.environment.get(key) or "")
        if match is None:
            continue
        port = match.group("port") or ("443" if match.group("scheme") in ("https", "wss") else "80")
        if port in fronts:
            draft.environment[key] = f"{match.group('scheme')}://localhost:{fronts[port]}{match.group('rest') or ''}"
            ports.add(fronts[port])
    if ports:  # the same line for every service: printed once
        draft.warnings.append(f"Dify's browser-facing URLs ({', '.join(BROWSER_URLS)}) that name its nginx as Docker "
                              f"publishes it (http://localhost) now name localhost:"
                              f"{'/'.join(map(str, sorted(ports)))}, the local end of the SSH tunnel `run.sh up` "
                              "prints: open the tunnel with that port on your laptop, or set them in .env to the "
                              "address your browser uses and convert again")


API = DifyApp(
    family="dify-api",
    images=r"dify-api$",
    ports={5001: Knob("env", "DIFY_PORT", "{port}")},
    address=Knob("env", "DIFY_BIND_ADDRESS", "{address}"),   # gunicorn --bind in its entrypoint.sh
    writable=("/app/logs",),
    workdir="/app/api",
)
WEB = DifyApp(
    family="dify-web",
    images=r"dify-web$",
    ports={3000: Knob("env", "PORT", "{port}")},
    address=Knob("env", "HOSTNAME", "{address}"),            # Next.js standalone server.js
    workdir="/app/web",
)
# dify-plugin-daemon listens on all addresses: its config (internal/types/app/config.go) has
# SERVER_PORT and PLUGIN_REMOTE_INSTALLING_HOST/_PORT (the debugging port) but no address for the
# API port, so the service is planned on 0.0.0.0 and the warning says so.
PLUGIN_DAEMON = DifyApp(
    family="dify-plugin-daemon",
    images=r"dify-plugin-daemon$",
    ports={5002: Knob("env", "SERVER_PORT", "{port}"), 5003: Knob("env", "PLUGIN_REMOTE_INSTALLING_PORT", "{port}")},
    workdir="/app",
)
# dify-agent's Dockerfile: WORKDIR /app/api, no ENTRYPOINT,
# CMD ["uvicorn", "dify_agent.server.app:app", "--host", "0.0.0.0", "--port", "5050"]
AGENT_BACKEND = DifyApp(
    family="dify-agent-backend",
    images=r"dify-agent-backend$",
    ports={5050: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--host", "{address}"),
    default_command=("uvicorn", "dify_agent.server.app:app", "--host", "0.0.0.0", "--port", "5050"),
    workdir="/app/api",
)


class Sandbox(DifyApp):
    """dify-sandbox runs each Code node after chroot(".") and setgroups/setgid/setuid to a sandbox
    id: 0.2.13 and later take a uid from 10000-10999 per run (and the group of the `sandbox` user
    it adds at start), earlier versions the fixed uid 65537. Only `--fakeroot` with those ids mapped
    allows that to an unprivileged user (docs/dify-sandbox.md)."""

    def fakeroot(self, service):
        tag = (service.image or "").split("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
        version = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)\b.*", tag)
        highest = 10999 if version and tuple(map(int, version.groups())) >= (0, 2, 13) else 65537
        return highest, (f"service {service.name!r}: Dify's Code nodes will not work here: dify-sandbox needs "
                         f"apptainer --fakeroot with ids 0-{highest} mapped (an /etc/subuid and /etc/subgid range "
                         f"of at least {highest} ids, from the admins). The rest of Dify runs; for Code nodes set "
                         "CODE_EXECUTION_ENDPOINT (and CODE_EXECUTION_API_KEY) in .env to a dify-sandbox run "
                         "elsewhere, then convert again")


# dify-sandbox serves gin on ":<port>" (all addresses) and has no address setting: planned on 0.0.0.0
SANDBOX = Sandbox(
    family="dify-sandbox",
    images=r"dify-sandbox$",
    ports={8194: Knob("env", "SANDBOX_PORT", "{port}")},
    workdir="/main",
    writable=("/var/sandbox",),
)


class Nginx(nginx.Nginx):
    """nginx behind Dify's entrypoint script (see the module's docstring)."""

    def render_environment(self, draft: Draft) -> Dict[str, str]:
        env = dict(draft.environment)
        original = draft.service.environment
        for key in ("NGINX_PORT", "NGINX_SSL_PORT"):  # the container ports: `listen` follows the plan
            if original.get(key):
                env[key] = original[key]
        upstream = env.get("NGINX_SOCKET_IO_UPSTREAM", "")
        if upstream and upstream.rsplit(":", 1)[0] not in draft.refs.service_of:
            env["NGINX_SOCKET_IO_UPSTREAM"] = "api:5001"  # api_websocket's profile is off: the api serves it
        env["ACME_CHALLENGE_LOCATION"] = (
            "location /.well-known/acme-challenge/ { root /var/www/html; }"
            if env.get("NGINX_ENABLE_CERTBOT_CHALLENGE") == "true" else "")
        env["HTTPS_CONFIG"] = ""
        if env.get("NGINX_HTTPS_ENABLED") == "true":
            domain = env.get("CERTBOT_DOMAIN")
            env["SSL_CERTIFICATE_PATH"] = (f"/etc/letsencrypt/live/{domain}/fullchain.pem" if domain else
                                           f"/etc/ssl/{env.get('NGINX_SSL_CERT_FILENAME', 'dify.crt')}")
            env["SSL_CERTIFICATE_KEY_PATH"] = (f"/etc/letsencrypt/live/{domain}/privkey.pem" if domain else
                                               f"/etc/ssl/{env.get('NGINX_SSL_CERT_KEY_FILENAME', 'dify.key')}")
            source = _bound_source(draft, "/etc/nginx/https.conf.template")
            if source is not None:
                with open(source, encoding="utf-8", errors="replace") as fh:
                    env["HTTPS_CONFIG"] = nginx.envsubst(fh.read().replace("\r\n", "\n"), env)
        return env

    def finish(self, draft: Draft) -> None:
        if _runs_mounted_entrypoint(draft):
            draft.binds = [b for b in draft.binds if b.target != MOUNTED_ENTRYPOINT]
            draft.launch = ["nginx", "-g", "daemon off;"]
        super().finish(draft)


class Squid(Adapter):
    """Dify's SSRF proxies: squid with templates rendered here, on its own address, and a private
    allow-list that covers the model servers of the stack (and --ssrf-allow)."""

    def finish(self, draft: Draft) -> None:
        if not _runs_mounted_entrypoint(draft):
            return
        draft.binds = [b for b in draft.binds if b.target != MOUNTED_ENTRYPOINT]
        env = dict(draft.environment)
        endpoint = draft.endpoints.get(int(draft.service.environment.get("HTTP_PORT") or 3128))
        root = f"config/{draft.name}/squid"
        kept: List[Bind] = []
        rendered = []
        for bind in draft.binds:
            if bind.kind == "bind" and bind.target.startswith("/etc/squid/") and bind.target.endswith(".template") \
                    and os.path.isfile(bind.source):
                with open(bind.source, encoding="utf-8", errors="replace") as fh:
                    text = nginx.envsubst(fh.read().replace("\r\n", "\n"), env)
                if endpoint is not None:
                    text = re.sub(r"(?m)^(\s*http_port\s+)\S+", rf"\g<1>{endpoint.address}:{endpoint.host}", text)
                target = bind.target[: -len(".template")]
                draft.configs[f"{root}{target}"] = draft.refs.rewrite(text, draft.name)
                rendered.append(target)
            else:
                kept.append(bind)
        draft.configs[f"{root}/etc/squid/dify_allow_private.conf"] = _private_allow_list(draft, env)
        rendered.append("/etc/squid/dify_allow_private.conf")
        for include in sorted(set(re.findall(r"(?m)^\s*include\s+(/etc/squid/\S+)", "".join(
                draft.configs[f"{root}{t}"] for t in rendered)))):
            if include not in rendered:  # written by the entrypoint from settings this stack leaves empty
                draft.configs[f"{root}{include}"] = "# compose2sif: empty (Dify's entrypoint writes it only when " \
                                                    "its settings are given)\n"
                rendered.append(include)
        draft.binds = kept + [Bind(f"{root}{t}", t, True, "config", False) for t in rendered]
        draft.launch = ["squid", "-NYC", "-f", "/etc/squid/squid.conf"]


def _private_allow_list(draft: Draft, env: Dict[str, str]) -> str:
    """What Dify's entrypoint writes to dify_allow_private.conf (included before `deny
    to_private_networks`), plus the model servers of this stack and the user's --ssrf-allow."""
    ips = [x.strip() for x in env.get("SSRF_PROXY_ALLOW_PRIVATE_IPS", "").split(",") if x.strip()]
    domains = [x.strip() for x in env.get("SSRF_PROXY_ALLOW_PRIVATE_DOMAINS", "").split(",") if x.strip()]
    network = draft.refs.network
    for service in draft.model_servers:
        if network is not None and service in network.own:
            ips.append(f"{network.names_address(service)}/32")
    for item in draft.ssrf_allow:
        (ips if re.fullmatch(r"[0-9a-fA-F.:/]+", item) else domains).append(item)
    lines = ["# compose2sif: private destinations Dify's SSRF proxy may reach (model servers, --ssrf-allow),",
             "# and the stack's own loopback addresses as clients, like Dify's private networks"]
    if network is not None:
        lines.append(f"acl client_localnet src {network.address_block}.0/24")
    if ips:
        lines += [f"acl allowed_private_ips dst {' '.join(dict.fromkeys(ips))}", "http_access allow allowed_private_ips"]
    if domains:
        lines += [f"acl allowed_private_domains dstdomain {' '.join(dict.fromkeys(domains))}",
                  "http_access allow allowed_private_domains"]
    return "\n".join(lines) + "\n"


class InitPermissions(Adapter):
    """`init_permissions` chowns Dify's storage to uid 1001. Under Apptainer every file is the user's
    and every service runs as the user, so there is nothing to do (and chown would fail)."""

    def finish(self, draft: Draft) -> None:
        if draft.launch and any("chown" in arg for arg in draft.launch):
            draft.launch = ["/bin/sh", "-c", "exit 0"]
            draft.warnings.append(f"service {draft.name!r}: its chown is not needed (every file and service is "
                                  "yours under Apptainer); it completes at once")


def _runs_mounted_entrypoint(draft: Draft) -> bool:
    return any(b.target == MOUNTED_ENTRYPOINT for b in draft.binds) and any(
        MOUNTED_ENTRYPOINT in arg for arg in draft.launch or [])


def _bound_source(draft: Draft, target: str):
    return next((b.source for b in draft.binds if b.target == target and os.path.isfile(b.source)), None)


NGINX = Nginx(
    family="dify-nginx",
    images=nginx.ADAPTER.images,
    ports={80: Knob("config", "nginx listen"), 443: Knob("config", "nginx listen")},
    address=Knob("config", "nginx listen"),
    per_port_address=True,
    writable=nginx.ADAPTER.writable,
    workdir="/",
    entry_path="/install",  # where Dify's admin account is made
    entry_port=nginx.ADAPTER.entry_port,
    tls_port=nginx.ADAPTER.tls_port,
    preset=PRESET,
)
SQUID = Squid(
    family="dify-squid",
    images=r"(^|/)squid$",
    ports={3128: Knob("config", "squid http_port")},
    address=Knob("config", "squid http_port"),
    writable=("/var/log/squid", "/var/spool/squid", "/var/cache/squid", "/run"),
    workdir="/",
    preset=PRESET,
)
BUSYBOX = InitPermissions(family="dify-init-permissions", images=r"(^|/)busybox$", workdir="/", preset=PRESET)
ADAPTERS = [API, WEB, PLUGIN_DAEMON, AGENT_BACKEND, SANDBOX, NGINX, SQUID, BUSYBOX]

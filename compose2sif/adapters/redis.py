"""Redis and Valkey: `--port` and `--bind` on redis-server's command line. A `--requirepass SECRET`
there would show SECRET to every user of the node in `ps`, so it moves into a private config file;
`redis-cli` in healthchecks is pointed at the planned address and port and authenticates from
REDISCLI_AUTH instead of `-a SECRET`."""
import re
import shlex
from typing import Dict, List

from compose2sif.adapters.base import Adapter, Draft, PasswordClient
from compose2sif.types import Bind, Knob

SECRETS_FILE = "/etc/compose2sif/redis.conf"
CLI = PasswordClient("redis-cli", "REDISCLI_AUTH", flags=("-a", "--pass"))


class Redis(Adapter):
    def finish(self, draft: Draft) -> None:
        if draft.launch and "--requirepass" in draft.launch:
            draft.launch = _password_to_file(draft)
        if draft.healthcheck:
            endpoint = draft.endpoints.get(6379)
            test = _cli_auth(draft.healthcheck, draft.environment)
            if endpoint is not None:
                host = draft.address if draft.address not in ("0.0.0.0", "::") else None
                test = _cli_target(test, host, endpoint.host if endpoint.moved else None)
            draft.healthcheck = test


ADAPTER = Redis(
    family="redis",
    images=r"(^|/)redis(-stack)?(-server)?$|valkey",
    ports={6379: Knob("flag", "--port", "{port}")},
    address=Knob("flag", "--bind", "{address}"),
    default_command=("redis-server",),
    workdir="/data",  # the image's WORKDIR
    clients=(CLI,),
)


def _password_to_file(draft: Draft) -> List[str]:
    launch = draft.launch
    i = launch.index("--requirepass")
    if i + 1 >= len(launch):
        return launch
    secret = launch[i + 1]
    argv = launch[:i] + launch[i + 2:]
    server = next((k for k, a in enumerate(argv) if a.endswith("redis-server")), None)
    if server is None:
        return launch
    lines = []
    if server + 1 < len(argv) and not argv[server + 1].startswith("-"):
        lines.append(f"include {argv.pop(server + 1)}")
    quoted = secret.replace("\\", "\\\\").replace('"', '\\"')
    lines.append(f'requirepass "{quoted}"')
    path = f"config/{draft.name}/redis/compose2sif.conf"
    draft.configs[path] = "\n".join(lines) + "\n"
    draft.binds.append(Bind(path, SECRETS_FILE, True, "config", False))
    draft.environment.setdefault(CLI.variable, secret)  # redis-cli (healthchecks, exec) reads it
    return argv[:server + 1] + [SECRETS_FILE] + argv[server + 1:]


def _cli_auth(test: List[str], env: Dict[str, str]) -> List[str]:
    """`redis-cli -a SECRET`: authenticate through REDISCLI_AUTH (CLI.variable) instead."""
    if test and test[0] == "CMD":
        kept, secret = CLI.take_password(test[1:])
        if secret is not None:
            env.setdefault(CLI.variable, secret)
            return [test[0], *kept]
    if test and test[0] == "CMD-SHELL":
        match = re.search(r"\s-a\s+(\"[^\"]*\"|'[^']*'|\S+)", test[1])
        if match:
            env.setdefault(CLI.variable, shlex.split(match.group(1))[0])
            return [test[0], test[1][:match.start()] + test[1][match.end():]]
    return test


def _cli_target(test: List[str], host, port) -> List[str]:
    """Add `-h ADDRESS` / `-p PORT` to redis-cli where it does not name them."""
    extra: List[str] = []
    if test and test[0] == "CMD-SHELL":
        script = test[1]
        if host and not re.search(r"\bredis-cli\b[^|;&]*\s-h\s", script):
            extra += ["-h", host]
        if port and not re.search(r"\bredis-cli\b[^|;&]*\s-p\s", script):
            extra += ["-p", str(port)]
        return [test[0], re.sub(r"\bredis-cli\b", "redis-cli " + " ".join(extra), script, count=1)] if extra else test
    out = []
    for arg in test:
        out.append(arg)
        if arg == "redis-cli" or arg.endswith("/redis-cli"):
            if host and "-h" not in test:
                out += ["-h", host]
            if port and "-p" not in test:
                out += ["-p", str(port)]
    return out

"""The command line. Thin: parse options, call the pipeline stages, print, exit.

Global options follow ``docker compose``: ``compose2sif -f a.yaml -f b.yaml --profile gpu config``.
Parsed with argparse: the standard library's parser starts in a fraction of click's time, and
`config` is measured against a Go binary (issue 12).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, List, Optional

from compose2sif import __version__
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions


def _out(text: str = "", end: str = "\n") -> None:
    sys.stdout.write(text + end)


def _err(text: str) -> None:
    sys.stderr.write(text + "\n")


class _State:
    def __init__(self, options: ProjectOptions):
        self.options = options

    def load(self):
        from compose2sif.convert import load
        return load(self.options, _err)


def config(state: _State, args) -> int:
    """Print the project as loaded: interpolated, merged, normalised to long syntax."""
    project = state.load()
    if args.list_services:
        for name in project.services:
            _out(name)
        return 0
    if args.list_profiles:
        names = set()
        for service in list(project.services.values()) + list(project.disabled.values()):
            names.update(service.get("profiles") or [])
        for name in sorted(names):
            _out(name)
        return 0
    document = project.config
    if args.format == "json":
        _out(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        import yaml
        _out(yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True), end="")
    return 0


def _convert(state: _State, args):
    """convert's work, shared by `up`: returns (plan, output dir)."""
    import socket
    from compose2sif.convert import ConvertOptions, convert as convert_project
    options = ConvertOptions(**{name: getattr(args, name) for name in ConvertOptions._fields})
    plan, out_dir = convert_project(state.options, options, _err)
    for service, port in ((plan.tls or {}).get("ports") or {}).items():
        _out(f"HTTPS: service {service} serves https://{socket.getfqdn()}:{port}/ (--tls)")
    return plan, out_dir


def convert(state: _State, args) -> int:
    """Write Singularity definitions, run.sh, env files, hosts and plan.json for the project."""
    plan, out_dir = _convert(state, args)
    shown = os.path.relpath(out_dir)
    shown = out_dir if shown.startswith("..") else shown
    _out(f"wrote {out_dir}: {len(plan.images)} image definition(s), {len(plan.services)} service(s); "
         f"next: {shown}/run.sh build && {shown}/run.sh up -d")
    return 0


def _existing_output(state: _State, output: Optional[str]) -> str:
    from compose2sif.convert import output_dir
    return output_dir(state.load(), output)


def _run(state: _State, args, script_args: List[str]) -> int:
    from compose2sif.runtime import run_script
    return run_script(_existing_output(state, args.output), script_args)


def secrets(state: _State, args) -> int:
    """Where the generated secrets are kept and which services use them."""
    from compose2sif.plan import generated
    out_dir = _existing_output(state, args.output)
    values = generated.read_stored(out_dir)
    if not values:
        _out(f"no generated secrets in {out_dir}")
        return 0
    _out(f"{os.path.join(out_dir, generated.SECRETS_FILE)} (mode 0600) holds {len(values)} generated secret(s):")
    users = generated.users(out_dir, values)
    for variable, secret in sorted(values.items()):
        where = ", ".join(users.get(variable, [])) or "no service's environment (configs only)"
        _out(f"  {variable}{'=' + secret if args.show else ''}: {where}")
    return 0


def build(state: _State, args) -> int:
    """Build the SIFs that are missing or whose definition changed (in parallel; C2S_BUILD_JOBS)."""
    return _run(state, args, ["build", *(["--pull"] if args.pull else []), *(["--force"] if args.force else [])])


def pull(state: _State, args) -> int:
    """Fetch again the images that services run from a registry, where their tag moved."""
    return _run(state, args, ["pull", *args.services])


def up(state: _State, args) -> int:
    """Convert, build what is missing, and start the services in dependency order."""
    from compose2sif.runtime import detect, run_script
    if detect() is None:
        raise ComposeError("neither apptainer nor singularity is on PATH (try: module load apptainer)")
    _, out_dir = _convert(state, args)
    rc = run_script(out_dir, ["build"])
    if rc != 0:
        return rc
    return run_script(out_dir, ["up", *(["-d"] if args.detach else []), *args.services])


def down(state: _State, args) -> int:
    """Stop every instance of the project."""
    return _run(state, args, ["down", *(["-v"] if args.volumes else [])])


def ps(state: _State, args) -> int:
    """State and health of each service."""
    return _run(state, args, ["ps", *(["--format", "json"] if args.format == "json" else [])])


def logs(state: _State, args) -> int:
    """A service's output."""
    return _run(state, args, ["logs", *(["-f"] if args.follow else []), args.service])


def port(state: _State, args) -> int:
    """Where a service's port is published, as `docker compose port` prints it."""
    return _run(state, args, ["port", *(["--index", str(args.index)] if args.index else []), args.service,
                              args.private_port])


def restart(state: _State, args) -> int:
    """Stop and start services again (default: every service started since `down`)."""
    return _run(state, args, ["restart", *args.services])


def exec_(state: _State, args) -> int:
    """Run a command inside a service's instance."""
    if not args.command:
        raise ComposeError(f"exec: name the command to run in {args.service} (compose2sif exec SERVICE COMMAND...)")
    return _run(state, args, ["exec", args.service, *args.command])


def doctor(state: _State, args) -> int:
    """What on this node would stop the project: ok, warn or fail lines with the fix; exit 1 on a fail."""
    from compose2sif import doctor as checks
    output = args.output
    if output is None:
        try:
            output = _existing_output(state, None)
        except ComposeError:  # no project here: the node is checked all the same
            output = None
    lines = checks.report(output)
    for level, text in lines:
        _out(f"{level:<4} {text}")
    return 1 if any(level == "fail" for level, _ in lines) else 0


def batch(state: _State, args) -> int:
    """Write a PJM or Slurm job script that runs the converted project (or SERVICEs) for the job's length."""
    from compose2sif import batch as batch_job
    out_dir = os.path.abspath(args.dir) if args.dir else _existing_output(state, None)  # --dir: no compose file
    options = batch_job.BatchOptions(
        scheduler=args.scheduler, group=args.group, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        elapse=args.elapse, job_output=args.job_output, modules=list(args.modules), interface=args.interface,
        launcher=args.launcher, mpi=args.mpi, site=args.site, site_file=args.site_file)
    script, warnings = batch_job.render(batch_job.load_plan(out_dir), out_dir, list(args.services), options)
    for warning in warnings:
        _err(f"WARN {warning}")
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(script)
        os.chmod(args.output, 0o755)
        _err(f"wrote {args.output}")
    else:
        _out(script, end="")
    return 0


# ---- the parser -------------------------------------------------------------------------------

class _Formatter(argparse.HelpFormatter):
    """argparse's, less its `import shutil` for the terminal's width: argparse makes a formatter
    for every option it is given, and that import was ~5 ms of each run."""

    def __init__(self, prog: str) -> None:
        try:
            width = int(os.environ.get("COLUMNS") or os.get_terminal_size(sys.stdout.fileno()).columns)
        except (OSError, ValueError):
            width = 80
        super().__init__(prog, width=width - 2)


class _Parser(argparse.ArgumentParser):
    """A usage error is one line naming the command and where its help is, exit 2."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value
    return parse


def _output_option(parser: argparse.ArgumentParser,
                   help: str = "The output directory (default: ./compose2sif-PROJECT).") -> None:
    parser.add_argument("-o", "--output", metavar="DIR", help=help)


def _convert_options(parser: argparse.ArgumentParser) -> None:
    """The options of `convert`, shared by `up`."""
    from compose2sif import adapters  # its presets and families name some choices
    _output_option(parser, "Output directory (default: ./compose2sif-PROJECT).")
    add = parser.add_argument
    add("--registry-mirror", action="append", default=[], metavar="[REGISTRY=]HOST[/PREFIX]",
        help="Pull a registry's images through this mirror (repeatable; no REGISTRY= means Docker Hub; "
             "http://HOST for a plain-HTTP one; C2S_REGISTRY_MIRRORS takes the same, comma-separated).")
    add("--image-source", dest="image_sources", action="append", default=[], metavar="SERVICE=KIND:PATH",
        help="Take a service's image from a docker-archive, oci-archive or ready sif file (repeatable).")
    add("--port-base", type=_at_least(1),
        help="First port of the block the moved ports go to (default: per user and project).")
    add("--address-block", metavar="127.A.B.0/24",
        help="Loopback /24 the services' own addresses come from (default: per user and project).")
    add("--offline", action="store_true", help="Do not ask registries for image configurations.")
    add("--tls", action="store_true", help=f"Serve HTTPS from the {' or '.join(adapters.tls_families())} "
        "service(s) with a self-signed certificate.")
    add("--tls-cert", metavar="FILE", help="Certificate for --tls instead of a self-signed one.")
    add("--tls-key", metavar="FILE", help="Private key of --tls-cert.")
    add("--preset", choices=sorted(adapters.PRESETS),
        help="Treat the project as this family's (default: detected from its images).")
    add("--ssrf-allow", dest="ssrf_allow", action="append", default=[], metavar="CIDR|DOMAIN",
        help="A private destination the project's SSRF proxies may reach, such as a model server elsewhere "
             "(repeatable; model servers of the stack are allowed already).")


def _config_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--format", choices=["yaml", "json"], default="yaml", help="Output format (default: yaml).")
    sub.add_argument("--services", dest="list_services", action="store_true",
                     help="Print the active service names, one a line.")
    sub.add_argument("--profiles", dest="list_profiles", action="store_true",
                     help="Print every profile name used, one a line.")


def _secrets_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("--show", action="store_true", help="Print the values too.")


def _build_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("--pull", action="store_true", help="Also build again the images whose registry tag moved.")
    sub.add_argument("--force", action="store_true",
                     help="Build every image again, a SIF put in place by hand included.")


def _pull_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("services", nargs="*", metavar="SERVICE")


def _up_arguments(sub: argparse.ArgumentParser) -> None:
    _convert_options(sub)
    sub.add_argument("-d", "--detach", action="store_true",
                     help="Start and return; restart policies run in the background.")
    sub.add_argument("services", nargs="*", metavar="SERVICE")
    sub.epilog = ("C2S_LISTEN_TIMEOUT=SECONDS (default 60): how long up waits for a service without a healthcheck "
                  "to listen on its ports; one slower than that is reported as started, not listening yet, and "
                  "watched (ps shows it until it listens). A service that exits is failed at once.")


def _down_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("-v", "--volumes", action="store_true", help="Also delete the named volumes.")


def _ps_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("--format", choices=["table", "json"], default="table", help="Output format (default: table).")


def _logs_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("-f", "--follow", action="store_true")
    sub.add_argument("service")


def _port_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("--index", type=int, help="Which replica of a service of several (default 1).")
    sub.add_argument("service")
    sub.add_argument("private_port", metavar="PRIVATE_PORT")


def _restart_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("services", nargs="*", metavar="SERVICE")


def _exec_arguments(sub: argparse.ArgumentParser) -> None:
    _output_option(sub)
    sub.add_argument("service")
    sub.add_argument("command", nargs=argparse.REMAINDER, metavar="COMMAND ...")


def _batch_arguments(sub: argparse.ArgumentParser) -> None:
    add = sub.add_argument
    add("services", nargs="*", metavar="SERVICE", help="Services to run, with what they depend on (default: all).")
    add("--scheduler", choices=["pjm", "slurm"], required=True)
    add("--dir", metavar="DIR", help="The output directory of convert (default: ./compose2sif-PROJECT).")
    add("--group", help="PJM resource group (rscgrp) or Slurm partition.")
    add("--site", help="A site whose conventions apply (flow), see docs/batch.md.")
    add("--site-file", metavar="FILE", help="JSON: more sites (resource groups, MPI style), see docs/batch.md.")
    add("--mpi", help="How one task per node is started: srun, openmpi (through pjrsh), fujitsu.")
    add("--nodes", type=_at_least(1), help="Default: what a model server spanning nodes over Ray needs (its parallel size / GPUs per node).")
    add("--gpus-per-node", type=_at_least(0), help="Default: the site's, else the largest GPU reservation.")
    add("--elapse", default="1:00:00", help="Wall time, H:MM:SS (default: 1:00:00).")
    add("--job-output", metavar="FILE", help="The job's output file.")
    add("--module", dest="modules", action="append", default=[], help="A module to load first (repeatable).")
    add("--interface", default="ib0", help="Network between the nodes (default: ib0; fallback: default route).")
    add("--launcher", help="Command that starts one task per node, as shell words ($VAR: the job's variable).")
    add("-o", "--output", metavar="FILE", help="Write the job script here (default: standard output).")


# name: (what it runs, what adds its options)
COMMANDS = {
    "config": (config, _config_arguments),
    "convert": (convert, _convert_options),
    "secrets": (secrets, _secrets_arguments),
    "build": (build, _build_arguments),
    "pull": (pull, _pull_arguments),
    "up": (up, _up_arguments),
    "down": (down, _down_arguments),
    "ps": (ps, _ps_arguments),
    "logs": (logs, _logs_arguments),
    "port": (port, _port_arguments),
    "exec": (exec_, _exec_arguments),
    "restart": (restart, _restart_arguments),
    "doctor": (doctor, lambda sub: _output_option(sub, "Output directory whose planned endpoints are checked.")),
    "batch": (batch, _batch_arguments),
}


def _parser(argv: List[str]) -> argparse.ArgumentParser:
    """The parser for this command line: only the command it names, where it names one (every
    option and command costs argparse a formatter and gettext lookups; `config` races a Go binary)."""
    parser = _Parser(prog="compose2sif",
                     description="Run Docker Compose projects as rootless Apptainer/Singularity instances.")
    add = parser.add_argument
    add("-f", "--file", dest="files", action="append", default=[], metavar="FILE",
        help="Compose file (repeatable; later files override earlier ones).")
    add("-p", "--project-name", help="Project name (default: `name:` in the file, else the directory name).")
    add("--profile", dest="profiles", action="append", default=[], help="Enable a profile (repeatable).")
    add("--env-file", dest="env_files", action="append", default=[], metavar="FILE",
        help="Environment file for interpolation (repeatable; default: .env in the project directory).")
    add("--project-directory", metavar="DIR",
        help="Base directory for relative paths (default: the first compose file's directory).")
    add("--version", action="version", version=f"compose2sif, version {__version__}")
    named = _command_word(parser, argv)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    for name, (function, arguments) in COMMANDS.items():
        if named in (None, name):
            doc = (function.__doc__ or "").strip()
            sub = commands.add_parser(name, help=doc, description=doc)
            sub.set_defaults(run=function)
            arguments(sub)
    return parser


def _command_word(parser: argparse.ArgumentParser, argv: List[str]) -> Optional[str]:
    """The command argv names, past the global options and their values (None: none we know)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        action = parser._option_string_actions.get(word)
        if action is not None and action.nargs != 0:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return word if word in COMMANDS else None
    return None


def _attach_values(parser: argparse.ArgumentParser, argv: List[str]) -> List[str]:
    """`-p -lead` as Docker Compose reads it: an option that takes a value takes the next word,
    whatever it starts with (argparse would take `-lead` for an option). Written attached
    (`-p-lead`, `--file=-x`), argparse reads it so too. Stops where exec's command begins."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: List[str] = []
    current, command, i = parser, None, 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return out + argv[i:]
        action = current._option_string_actions.get(word)
        if action is not None and action.nargs != 0 and i + 1 < len(argv):
            out.append(f"{word}={argv[i + 1]}" if word.startswith("--") else word + argv[i + 1])
            i += 2
            continue
        out.append(word)
        i += 1
        if not word.startswith("-"):
            if command is None and word in subparsers.choices:
                command, current = word, subparsers.choices[word]
            elif command == "exec":  # the service: what follows is the command to run, verbatim
                return out + argv[i:]
    return out


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(argv)
    args = parser.parse_args(_attach_values(parser, argv))
    state = _State(ProjectOptions(files=args.files, project_name=args.project_name, profiles=args.profiles,
                                  env_files=args.env_files, project_directory=args.project_directory))
    try:
        sys.exit(args.run(state, args))
    except ComposeError as exc:
        _err(f"compose2sif: error: {exc}")
        sys.exit(1)
    except KeyboardInterrupt:
        _err("compose2sif: aborted")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:  # a bug of ours: still one line, with a way to get the details
        if os.environ.get("COMPOSE2SIF_DEBUG"):
            raise
        _err(f"compose2sif: internal error: {type(exc).__name__}: {exc} "
             "(set COMPOSE2SIF_DEBUG=1 for a traceback, and please report it)")
        sys.exit(70)


if __name__ == "__main__":
    main()

"""The command line. Thin: parse options, call the pipeline stages, print, exit.

Global options follow ``docker compose``: ``compose2sif -f a.yaml -f b.yaml --profile gpu config``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
from typing import List, Optional

import click
import yaml

from compose2sif import __version__
from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project


class _State:
    def __init__(self, options: ProjectOptions):
        self.options = options

    def load(self):
        try:
            project = load_project(self.options)
        except ComposeError as exc:
            created = _dotenv_from_example(str(exc))
            if created is None:
                raise
            click.echo(f"created {created} from .env.example, as Dify's setup does; edit it to change settings",
                       err=True)
            project = load_project(self.options)
        for warning in project.warnings:
            click.echo(f"WARN {warning}", err=True)
        return project


def _dotenv_from_example(error: str) -> Optional[str]:
    """Dify's compose needs ./.env, which its users copy from .env.example. Do that for them."""
    import re
    import shutil
    match = re.search(r"env file (\S+/\.env) not found", error)
    if match is None:
        return None
    dotenv = match.group(1)
    example = dotenv + ".example"
    folder = os.path.dirname(dotenv)
    composes = [os.path.join(folder, n) for n in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml")]
    if not os.path.isfile(example) or not any(
            os.path.isfile(c) and "langgenius/dify-" in open(c, encoding="utf-8", errors="replace").read()
            for c in composes):
        return None
    with open(os.open(dotenv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as out, \
            open(example, encoding="utf-8") as source:
        shutil.copyfileobj(source, out)
    return dotenv


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-f", "--file", "files", multiple=True, metavar="FILE",
              help="Compose file (repeatable; later files override earlier ones).")
@click.option("-p", "--project-name", help="Project name (default: `name:` in the file, else the directory name).")
@click.option("--profile", "profiles", multiple=True, help="Enable a profile (repeatable).")
@click.option("--env-file", "env_files", multiple=True, metavar="FILE",
              help="Environment file for interpolation (repeatable; default: .env in the project directory).")
@click.option("--project-directory", metavar="DIR",
              help="Base directory for relative paths (default: the first compose file's directory).")
@click.version_option(__version__, prog_name="compose2sif")
@click.pass_context
def cli(ctx, files, project_name, profiles, env_files, project_directory):
    """Run Docker Compose projects as rootless Apptainer/Singularity instances."""
    ctx.obj = _State(ProjectOptions(files=list(files), project_name=project_name, profiles=list(profiles),
                                    env_files=list(env_files), project_directory=project_directory))


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--services", "list_services", is_flag=True, help="Print the active service names, one a line.")
@click.option("--profiles", "list_profiles", is_flag=True, help="Print every profile name used, one a line.")
@click.pass_obj
def config(state: _State, fmt: str, list_services: bool, list_profiles: bool):
    """Print the project as loaded: interpolated, merged, normalised to long syntax."""
    project = state.load()
    if list_services:
        for name in project.services:
            click.echo(name)
        return
    if list_profiles:
        names = set()
        for service in list(project.services.values()) + list(project.disabled.values()):
            names.update(service.get("profiles") or [])
        for name in sorted(names):
            click.echo(name)
        return
    document = project.config
    if fmt == "json":
        click.echo(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        click.echo(yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True), nl=False)


def _output_dir(project, output: Optional[str]) -> str:
    return os.path.abspath(output or os.path.join(os.getcwd(), f"compose2sif-{project.name}"))


def _previous_endpoints(out_dir: str) -> set:
    """(address, port) of an earlier plan of this output dir: ours, so not 'busy' when we plan again."""
    try:
        with open(os.path.join(out_dir, "plan.json"), encoding="utf-8") as fh:
            plan = json.load(fh)
        ours = {(p["address"], p["host"]) for s in plan.get("services", []) for p in s.get("ports", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()
    return ours | {("::", port) for address, port in ours if address == "0.0.0.0"}  # nginx's `listen [::]:P`


def _convert(state: "_State", output=None, registry_mirror=None, image_sources=(), port_base=None, offline=False,
             tls=False, tls_cert=None, tls_key=None, address_block=None, preset=None, ssrf_allow=()):
    from compose2sif import adapters, render
    from compose2sif.plan import PlanOptions, build_plan, image_definitions
    from compose2sif.plan import generated
    from compose2sif.plan.network import node_listeners, parse_address_block

    project = state.load()
    out_dir = _output_dir(project, output)
    sources = {}
    for item in image_sources:
        service, sep, spec = item.partition("=")
        if not sep:
            raise ComposeError(f"--image-source {item}: expected SERVICE=KIND:PATH")
        sources[service] = spec
    if bool(tls_cert) != bool(tls_key):
        raise ComposeError("--tls-cert and --tls-key go together")
    images_used = [s.get("image") for s in project.services.values()]
    presets = {preset} if preset else adapters.presets_for(images_used)
    table = adapters.preset_secrets(presets)
    chosen = generated.choose(table, project.environment, generated.read_stored(out_dir)) if table else {}
    if chosen:  # load again as if the user had set them: interpolation puts each where it belongs
        environ = dict(os.environ if state.options.environ is None else state.options.environ)
        project = load_project(dataclasses.replace(state.options, environ={**environ, **chosen}))
    options = PlanOptions(registry_mirror=registry_mirror, image_sources=sources, port_base=port_base,
                          address_block=parse_address_block(address_block) if address_block else None,
                          busy=node_listeners() - _previous_endpoints(out_dir), tls=bool(tls or tls_cert),
                          tls_files=(os.path.abspath(tls_cert), os.path.abspath(tls_key)) if tls_cert else None,
                          presets=presets, secrets=generated.Replacer(table, chosen) if chosen else None,
                          ssrf_allow=list(ssrf_allow))
    try:
        images = image_definitions(project, options)
    except ComposeError as exc:
        if exc.file is None and exc.path and exc.path.startswith("services."):
            exc.file, exc.line = project.locate(exc.path.split(".")[1])
        raise
    if not offline:
        from compose2sif import registry  # requests: slow to import, not needed offline
        for source in images.values():
            image = source.ref if source.kind == "docker" else source.pull_candidate  # build + image: pull?
            if image is None:
                continue
            from compose2sif.plan.images import docker_reference
            ref = docker_reference(image, registry_mirror)
            try:
                options.image_configs[image] = registry.fetch_config(
                    ref, insecure=bool(os.environ.get("APPTAINER_NOHTTPS") or os.environ.get("SINGULARITY_NOHTTPS")))
            except Exception as exc:  # network, auth, odd registries: the plan just lacks it
                if source.kind == "docker":
                    click.echo(f"WARN could not read the configuration of image {source.ref} from its registry "
                               f"({type(exc).__name__}); its WORKDIR and exposed ports are unknown", err=True)
    try:
        plan = build_plan(project, options)
    except ComposeError as exc:  # point it at the service's definition
        if exc.file is None and exc.path and exc.path.startswith("services."):
            exc.file, exc.line = project.locate(exc.path.split(".")[1])
        raise
    images = image_definitions(project, options)  # with the registry's answers: build + image may pull
    try:
        extra = render.write(plan, images, out_dir)
    except ComposeError as exc:
        if exc.file is None and exc.path and exc.path.startswith("services."):
            exc.file, exc.line = project.locate(exc.path.split(".")[1])
        raise
    if chosen:
        render.write_private(out_dir, generated.SECRETS_FILE, generated.file_text(chosen))
        click.echo(f"secrets: {len(chosen)} public default(s) replaced by generated values, kept in "
                   f"{os.path.join(out_dir, generated.SECRETS_FILE)} (`compose2sif secrets` shows where each is used)",
                   err=True)
    for warning in plan.warnings + extra:
        if warning not in project.warnings:
            click.echo(f"WARN {warning}", err=True)
    for service, port in ((plan.tls or {}).get("ports") or {}).items():
        click.echo(f"HTTPS: service {service} serves https://{socket.getfqdn()}:{port}/ (--tls)")
    return plan, out_dir


def _convert_options(command):
    """The options of `convert`, shared by `up`."""
    options = [
        click.option("-o", "--output", metavar="DIR", help="Output directory (default: ./compose2sif-PROJECT)."),
        click.option("--registry-mirror", metavar="HOST", help="Pull Docker Hub images through this registry."),
        click.option("--image-source", "image_sources", multiple=True, metavar="SERVICE=KIND:PATH",
                     help="Take a service's image from a docker-archive, oci-archive or ready sif file (repeatable)."),
        click.option("--port-base", type=int,
                     help="First port of the block the moved ports go to (default: per user and project)."),
        click.option("--address-block", metavar="127.A.B.0/24",
                     help="Loopback /24 the services' own addresses come from (default: per user and project)."),
        click.option("--offline", is_flag=True, help="Do not ask registries for image configurations."),
        click.option("--tls", is_flag=True, help="Serve HTTPS from the nginx service(s) with a self-signed certificate."),
        click.option("--tls-cert", metavar="FILE", help="Certificate for --tls instead of a self-signed one."),
        click.option("--tls-key", metavar="FILE", help="Private key of --tls-cert."),
        click.option("--preset", type=click.Choice(["dify"]),
                     help="Treat the project as this family's (default: detected from its images)."),
        click.option("--ssrf-allow", "ssrf_allow", multiple=True, metavar="CIDR|DOMAIN",
                     help="A private destination the project's SSRF proxies may reach, such as a vLLM host "
                          "(repeatable; model servers of the stack are allowed already)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@cli.command()
@_convert_options
@click.pass_obj
def convert(state: _State, **choices):
    """Write Singularity definitions, run.sh, env files, hosts and plan.json for the project."""
    plan, out_dir = _convert(state, **choices)
    shown = os.path.relpath(out_dir)
    shown = out_dir if shown.startswith("..") else shown
    click.echo(f"wrote {out_dir}: {len(plan.images)} image definition(s), {len(plan.services)} service(s); "
               f"next: {shown}/run.sh build && {shown}/run.sh up -d")


def _existing_output(state: _State, output: Optional[str]) -> str:
    project = state.load()
    return _output_dir(project, output)


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.option("--show", is_flag=True, help="Print the values too.")
@click.pass_obj
def secrets(state: _State, output, show):
    """Where the generated secrets are kept and which services use them."""
    import shlex
    from compose2sif.plan import generated
    out_dir = _existing_output(state, output)
    values = generated.read_stored(out_dir)
    if not values:
        click.echo(f"no generated secrets in {out_dir}")
        return
    click.echo(f"{os.path.join(out_dir, generated.SECRETS_FILE)} (mode 0600) holds {len(values)} generated secret(s):")
    users = {}
    env_dir = os.path.join(out_dir, "env")
    for name in sorted(os.listdir(env_dir)) if os.path.isdir(env_dir) else []:
        if not name.endswith(".env") or name.endswith(".eval.env"):
            continue
        with open(os.path.join(env_dir, name), encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and not key.startswith("#") and key != "C2S_LAUNCH":
                    for variable, secret in values.items():
                        if secret in "".join(shlex.split(value)):
                            users.setdefault(variable, []).append(f"{name[:-4]}:{key}")
    for variable, secret in sorted(values.items()):
        where = ", ".join(users.get(variable, [])) or "no service's environment (configs only)"
        click.echo(f"  {variable}{'=' + secret if show else ''}: {where}")


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.option("--pull", is_flag=True, help="Also build again the images whose registry tag moved.")
@click.pass_obj
def build(state: _State, output, pull):
    """Build the SIFs that are missing or whose definition changed (in parallel; C2S_BUILD_JOBS)."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["build", *(["--pull"] if pull else [])]))


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.argument("services", nargs=-1)
@click.pass_obj
def pull(state: _State, output, services):
    """Fetch again the images that services run from a registry, where their tag moved."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["pull", *services]))


@cli.command()
@_convert_options
@click.option("-d", "--detach", is_flag=True, help="Start and return; restart policies run in the background.")
@click.argument("services", nargs=-1)
@click.pass_obj
def up(state: _State, detach, services, **choices):
    """Convert, build what is missing, and start the services in dependency order."""
    from compose2sif.runtime import detect, run_script
    if detect() is None:
        raise ComposeError("neither apptainer nor singularity is on PATH (try: module load apptainer)")
    _, out_dir = _convert(state, **choices)
    rc = run_script(out_dir, ["build"])
    if rc != 0:
        sys.exit(rc)
    sys.exit(run_script(out_dir, ["up", *(["-d"] if detach else []), *services]))


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.option("-v", "--volumes", is_flag=True, help="Also delete the named volumes.")
@click.pass_obj
def down(state: _State, output, volumes):
    """Stop every instance of the project."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["down", *(["-v"] if volumes else [])]))


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.pass_obj
def ps(state: _State, output, fmt):
    """State and health of each service."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["ps", *(["--format", "json"] if fmt == "json" else [])]))


@cli.command()
@click.option("-o", "--output", metavar="DIR")
@click.option("-f", "--follow", is_flag=True)
@click.argument("service")
@click.pass_obj
def logs(state: _State, output, follow, service):
    """A service's output."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["logs", *(["-f"] if follow else []), service]))


@cli.command(name="exec", context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", metavar="DIR")
@click.argument("service")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_obj
def exec_(state: _State, output, service, command):
    """Run a command inside a service's instance."""
    from compose2sif.runtime import run_script
    sys.exit(run_script(_existing_output(state, output), ["exec", service, *command]))


@cli.command()
@click.option("-o", "--output", metavar="DIR", help="Output directory whose planned endpoints are checked.")
@click.pass_obj
def doctor(state: _State, output):
    """What on this node would stop the project: ok, warn or fail lines with the fix; exit 1 on a fail."""
    from compose2sif import doctor as checks
    if output is None:
        try:
            output = _existing_output(state, None)
        except ComposeError:  # no project here: the node is checked all the same
            output = None
    lines = checks.report(output)
    for level, text in lines:
        click.echo(f"{level:<4} {text}")
    sys.exit(1 if any(level == "fail" for level, _ in lines) else 0)


@cli.command()
@click.option("--scheduler", type=click.Choice(["pjm", "slurm"]), required=True)
@click.option("--service", help="The service to serve (default: the one with GPUs).")
@click.option("--group", help="PJM resource group (rscgrp) or Slurm partition.")
@click.option("--nodes", type=click.IntRange(min=1), help="Default: tensor x pipeline parallel size / GPUs per node.")
@click.option("--gpus-per-node", type=click.IntRange(min=0), help="Default: the service's GPU reservation.")
@click.option("--elapse", default="1:00:00", show_default=True, help="Wall time, H:MM:SS.")
@click.option("--job-output", metavar="FILE", help="The job's output file.")
@click.option("--module", "modules", multiple=True, help="A module to load first (repeatable).")
@click.option("--sif", metavar="FILE", help="The service's SIF (default: its x-compose2sif.image.sif).")
@click.option("--cache-dir", metavar="DIR", help="Bound on /cache for model caches (default: PROJECT_DIR/cache).")
@click.option("--interface", default="ib0", show_default=True, help="Network between the nodes (fallback: default route).")
@click.option("--launcher", help="Command that starts one task per node (default: srun ... / mpiexec -n N -ppn 1).")
@click.option("-o", "--output", metavar="FILE", help="Write the job script here (default: standard output).")
@click.pass_obj
def batch(state: _State, output, service, **options):
    """Write a PJM or Slurm job script that serves SERVICE for the job's length (Ray across nodes)."""
    from compose2sif import batch as batch_job
    from compose2sif.model import services as typed_services
    project = state.load()
    chosen = batch_job.pick_service(typed_services(project), service)
    try:
        script, warnings = batch_job.render(project.name, project.working_dir, chosen,
                                            batch_job.BatchOptions(modules=list(options.pop("modules")), **options))
    except ComposeError as exc:
        if exc.file is None and exc.path and exc.path.startswith("services."):
            exc.file, exc.line = project.locate(exc.path.split(".")[1])
        raise
    for warning in warnings:
        click.echo(f"WARN {warning}", err=True)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(script)
        os.chmod(output, 0o755)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(script, nl=False)


def main(argv: Optional[List[str]] = None) -> None:
    try:
        cli.main(args=argv, prog_name="compose2sif", standalone_mode=False)
    except ComposeError as exc:
        click.echo(f"compose2sif: error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("compose2sif: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as exc:  # a bug of ours: still one line, with a way to get the details
        if os.environ.get("COMPOSE2SIF_DEBUG"):
            raise
        click.echo(f"compose2sif: internal error: {type(exc).__name__}: {exc} "
                   "(set COMPOSE2SIF_DEBUG=1 for a traceback, and please report it)", err=True)
        sys.exit(70)


if __name__ == "__main__":
    main()

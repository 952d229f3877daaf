"""The command line. Thin: parse options, call the pipeline stages, print, exit.

Global options follow ``docker compose``: ``compose2sif -f a.yaml -f b.yaml --profile gpu config``.
"""
from __future__ import annotations

import json
import os
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
        project = load_project(self.options)
        for warning in project.warnings:
            click.echo(f"WARN {warning}", err=True)
        return project


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

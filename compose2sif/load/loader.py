"""Load a compose project exactly as Docker Compose does.

The stages, in compose-go's order, for each YAML document of each ``-f`` file:

1. parse YAML (:mod:`yaml_source`), take out ``!reset``/``!override`` markers;
2. interpolate variables, casting typed values (:mod:`interpolate`);
3. ``include``: load each included project on its own and import its resources (:mod:`include`);
4. ``extends``: merge each service onto the service it extends (:mod:`extends`);
5. merge onto the files before it (:mod:`merge`), then validate by the schema (:mod:`validate`);
6. short syntax to long syntax (:mod:`canonical`).

Before that, the files, env files and project name are found (:mod:`discovery`). Then, for the whole
project: defaults, relative paths made absolute (:mod:`paths`), environment resolved (:mod:`normalize`),
profiles applied (:mod:`profiles`), consistency checked (:mod:`consistency`), env_file merged
(:mod:`env_files`), and the model encoded as `config` prints it (:mod:`encode`).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load.canonical import canonical, set_defaults
from compose2sif.load.consistency import check_consistency
from compose2sif.load.context import LoadContext
from compose2sif.load.discovery import (absolute, checked_project_name, defining_file, discover, name_from_files,
                                        normalize_project_name, read_env_files)
from compose2sif.load.encode import encode_project
from compose2sif.load.env_files import merge_env_files, merge_label_files
from compose2sif.load.extends import apply_extends
from compose2sif.load.include import apply_include
from compose2sif.load.interpolate import interpolate_tree
from compose2sif.load.merge import apply_resets, collect_resets, enforce_unicity, merge_mappings
from compose2sif.load.normalize import normalize, resolve_list_environment
from compose2sif.load.paths import resolve_paths
from compose2sif.load.profiles import has_profile, selected_profiles
from compose2sif.load.validate import go_quote, validate
from compose2sif.load.yaml_source import Document
from compose2sif.support import unsupported_warnings


# Named tuples, not dataclasses: `config` races a Go binary, and dataclasses costs ~5 ms of imports.
class ProjectOptions(NamedTuple):
    """What the user said on the command line (docker compose's global options)."""
    files: Sequence[str] = ()
    project_name: Optional[str] = None
    project_directory: Optional[str] = None
    profiles: Sequence[str] = ()
    env_files: Sequence[str] = ()
    environ: Optional[Dict[str, str]] = None  # defaults to os.environ
    cwd: Optional[str] = None                 # defaults to os.getcwd()


class Project(NamedTuple):
    """The loaded project: plain compose data in long syntax, as Compose itself holds it."""
    name: str
    working_dir: str
    files: List[str]
    environment: Dict[str, str]               # interpolation environment (host + .env)
    model: Dict[str, Any]                     # top-level keys, services = active ones only
    config: Dict[str, Any]                    # the model as `docker compose config` prints it
    disabled: Dict[str, Dict[str, Any]]       # services switched off by profiles
    profiles: List[str]
    warnings: List[str]
    origins: Dict[str, Tuple[str, Optional[int]]]  # service -> (file, line)

    @property
    def services(self) -> Dict[str, Dict[str, Any]]:
        return self.model.get("services") or {}

    def locate(self, service: str) -> Tuple[Optional[str], Optional[int]]:
        return self.origins.get(service, (None, None))



class _Loader:
    """The per-file pipeline, for the project or for one included project."""

    def __init__(self, ctx: LoadContext, environment: Dict[str, str], working_dir: str,
                 included: Tuple[str, ...] = ()):
        self.ctx = ctx
        self.environment = environment
        self.working_dir = working_dir
        self.included = included

    def nested(self, environment: Dict[str, str], working_dir: str, included: Tuple[str, ...]) -> "_Loader":
        return _Loader(self.ctx, environment, working_dir, included)

    def lookup(self, name: str) -> Optional[str]:
        return self.environment.get(name)

    def load_model(self, files: List[str]) -> Dict[str, Any]:
        model: Dict[str, Any] = {}
        for path in files:
            for doc in self.ctx.documents_of(path):
                try:
                    model = self._load_document(doc, model)
                except ComposeError as exc:
                    raise self.ctx.error_in(exc, doc) from None
        set_defaults(model)
        resolve_paths(model, self.working_dir)
        resolve_list_environment(model, self.environment)
        return model

    def _load_document(self, doc: Document, model: Dict[str, Any]) -> Dict[str, Any]:
        data, reset_paths = collect_resets(doc.data)
        data = interpolate_tree(data, self.lookup, self.ctx.unset_variable)
        if "include" in data:
            apply_include(self, data, doc)
        apply_resets(model, reset_paths)
        apply_extends(self, data, doc, reset_paths)
        for name in (data.get("services") or {}) if isinstance(data.get("services"), dict) else ():
            self.ctx.origins.setdefault(name, (doc.filename, doc.line_of("services", name)))
            self.ctx.documents[name] = doc
        model = merge_mappings(model, data, ())
        model = enforce_unicity(model)
        validate(model, doc.filename, doc.line_of)
        if "version" in model:
            self.ctx.warnings.append(f"{doc.filename}: the attribute `version` is obsolete, it will be ignored")
            del model["version"]
        model = canonical(model)
        return enforce_unicity(model)

    # -- include --------------------------------------------------------------------------------


# ---- entry point ------------------------------------------------------------------------------

def load_project(options: ProjectOptions) -> Project:
    files: List[str] = []  # filled in as soon as they are known, to name them in the error below
    try:
        return _load_project(options, files)
    except RecursionError:
        # Values nested hundreds of levels deep: Compose reads them, Python's recursion limit stops us.
        raise ComposeError("values nested too deeply to be read (a list or mapping hundreds of levels deep)"
                           ).located(files[0] if files else None) from None


def _load_project(options: ProjectOptions, known_files: List[str]) -> Project:
    environ = dict(os.environ if options.environ is None else options.environ)
    cwd = os.path.abspath(options.cwd or os.getcwd())
    project_dir = absolute(options.project_directory, cwd) if options.project_directory else None

    files = [absolute(f, cwd) if f != "-" else f for f in options.files]
    if "-" in files:
        raise ComposeError("reading a compose file from standard input is not supported; pass a path")
    default_dir = project_dir or (os.path.dirname(files[0]) if files else cwd)

    env_paths = _env_files(options, environ, cwd, default_dir)
    environment = dict(read_env_files(env_paths, environ))
    environment.update(environ)  # the host environment wins over .env

    if not files and environment.get("COMPOSE_FILE"):
        separator = environment.get("COMPOSE_PATH_SEPARATOR") or os.pathsep
        files = [absolute(f, cwd) for f in environment["COMPOSE_FILE"].split(separator) if f]
    if not files:
        files = discover(default_dir)
    working_dir = project_dir or os.path.dirname(files[0])
    known_files.extend(files)
    # Compose reads the .env again once the files are known: the project directory's, when it is not the
    # one read above (a compose file found in a parent directory, or named by COMPOSE_FILE); values
    # already set win.
    project_env = [p for p in _env_files(options, environ, cwd, working_dir) if p not in env_paths]
    for key, value in read_env_files(project_env, environment).items():
        environment.setdefault(key, value)
    env_paths += project_env

    ctx = LoadContext()
    if options.project_name:
        name = checked_project_name(options.project_name)
    elif environment.get("COMPOSE_PROJECT_NAME"):
        try:
            name = checked_project_name(environment["COMPOSE_PROJECT_NAME"])
        except ComposeError as exc:
            raise exc.located(None if "COMPOSE_PROJECT_NAME" in environ else defining_file(
                env_paths, "COMPOSE_PROJECT_NAME")) from None
    else:
        name = name_from_files(files, environment.get, ctx)
        if name is None:
            name = normalize_project_name(os.path.basename(working_dir))
        elif not name:
            raise ComposeError("project name must not be empty (`name:` has no letter or digit)").located(
                defining_file(files, "name", separator=":"))
    if not name:
        raise ComposeError(f"project name must not be empty (the directory name "
                           f"{go_quote(os.path.basename(working_dir))} has no letter or digit); use -p or a `name:` key"
                           ).located(files[0])
    environment["COMPOSE_PROJECT_NAME"] = name

    profiles = selected_profiles(options.profiles, environment)

    model = _Loader(ctx, environment, working_dir).load_model(files)
    if not model:
        raise ComposeError("empty compose file").located(files[0])
    model.pop("include", None)
    model["name"] = name
    services = model.get("services") or {}
    for sname, service in list(services.items()):
        if service is None:
            services[sname] = {}
    try:
        normalize(model, name, environment)
    except ComposeError as exc:
        raise _locate(exc, ctx) from None

    active = {n: s for n, s in services.items() if has_profile(s, profiles)}
    disabled = {n: s for n, s in services.items() if n not in active}
    model["services"] = active
    try:
        check_consistency(model, disabled)
        for sname, service in active.items():
            merge_env_files(service, environment, f"services.{sname}")
            merge_label_files(service, environment, f"services.{sname}")
        config = encode_project(model)  # also checks durations, sizes, counts
    except ComposeError as exc:
        raise _locate(exc, ctx) from None

    for sname, service in active.items():
        ctx.warnings.extend(unsupported_warnings(sname, service))

    return Project(name=name, working_dir=working_dir, files=files, environment=environment, model=model,
                   config=config, disabled=disabled, profiles=profiles, warnings=ctx.warnings, origins=ctx.origins)


def _env_files(options: ProjectOptions, environ: Dict[str, str], cwd: str, directory: str) -> List[str]:
    """--env-file's files, else the directory's .env (unless COMPOSE_DISABLE_ENV_FILE)."""
    if options.env_files:
        return [absolute(f, cwd) for f in options.env_files]
    if str(environ.get("COMPOSE_DISABLE_ENV_FILE", "")).lower() in ("1", "true"):
        return []
    default_env = os.path.join(directory, ".env")
    return [default_env] if os.path.isfile(default_env) else []


def _locate(exc: ComposeError, ctx: LoadContext) -> ComposeError:
    """Point a project-wide error at the file and line of the key, or else of its service."""
    if exc.file is None and exc.path and exc.path.startswith("services."):
        parts = tuple(p.split("[")[0] for p in exc.path.split("."))
        doc = ctx.documents.get(parts[1])
        if doc is not None and doc.line_of(*parts) is not None and doc.line_of(*parts[:3]) != doc.line_of(*parts[:2]):
            exc.file, exc.line = doc.filename, doc.line_of(*parts)
        elif parts[1] in ctx.origins:
            exc.file, exc.line = ctx.origins[parts[1]]
    elif exc.file is None and exc.path:  # a top-level resource: the last document that declares it
        parts = tuple(p.split("[")[0] for p in exc.path.split("."))[:2]
        for doc in reversed(ctx.parsed_documents()):
            if parts in doc.lines:
                exc.file, exc.line = doc.filename, doc.lines[parts]
                break
    return exc

"""Load a compose project exactly as Docker Compose does.

The stages, in compose-go's order, for each YAML document of each ``-f`` file:

1. parse YAML (:mod:`yaml_source`), take out ``!reset``/``!override`` markers;
2. interpolate variables, casting typed values (:mod:`interpolate`);
3. ``include``: load each included project on its own and import its resources;
4. ``extends``: merge each service onto the service it extends;
5. merge onto the files before it (:mod:`merge`), then validate keys;
6. short syntax to long syntax (:mod:`canonical`).

Then, for the whole project: defaults, relative paths made absolute, environment resolved,
profiles applied, consistency checked (undefined services, volumes, cycles), env_file merged.
"""
from __future__ import annotations

import os
import posixpath
import re
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from compose2sif.errors import ComposeError
from compose2sif.load import dotenv
from compose2sif.load.canonical import canonical, set_defaults
from compose2sif.load.encode import encode_project
from compose2sif.load.interpolate import interpolate_tree
from compose2sif.load.merge import apply_resets, collect_resets, enforce_unicity, merge, merge_mappings
from compose2sif.load.validate import go_quote, validate
from compose2sif.load.yaml_source import Document, load_documents
from compose2sif.support import unsupported_warnings

DEFAULT_FILES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")
OVERRIDE_FILES = ("compose.override.yml", "compose.override.yaml",
                  "docker-compose.override.yml", "docker-compose.override.yaml")
RESOURCE_KINDS = ("services", "volumes", "networks", "secrets", "configs", "models")


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


# Parsed files, by path and text, for a process that loads a project twice (`convert` loads
# again with generated secrets). Safe to share: the loader only reads a Document (collect_resets
# copies what it keeps). A few entries: a long-running caller does not grow it.
_PARSED: Dict[Tuple[str, str], List[Document]] = {}


def _parsed_documents(path: str, text: str) -> List[Document]:
    key = (path, text)
    if key not in _PARSED:
        if len(_PARSED) >= 16:
            _PARSED.clear()
        _PARSED[key] = load_documents(path, text)
    return _PARSED[key]


class _Context:
    """State shared by one load: where each service was defined, and the documents read."""

    def __init__(self) -> None:
        self.origins: Dict[str, Tuple[str, Optional[int]]] = {}
        self.documents: Dict[str, Document] = {}  # service -> the document that last set it
        self.warnings: List[str] = []
        self._unset: Set[str] = set()
        self._parsed: Dict[str, List[Document]] = {}

    def parsed_documents(self) -> List[Document]:
        return [doc for docs in self._parsed.values() for doc in docs]

    def documents_of(self, path: str) -> List[Document]:
        """The YAML documents of a file, parsed once per load (the loader only reads them)."""
        if path not in self._parsed:
            self._parsed[path] = _parsed_documents(path, _read(path))
        return self._parsed[path]

    def unset_variable(self, name: str) -> None:
        if name not in self._unset:
            self._unset.add(name)
            self.warnings.append(f"the {name!r} variable is not set; using an empty string")

    def error_in(self, exc: ComposeError, doc: Optional[Document]) -> ComposeError:
        if exc.file is None and doc is not None:
            parts = tuple(p for p in (exc.path or "").split(".") if p)
            exc.file, exc.line = doc.filename, doc.line_of(*parts) if parts else None
        return exc


# ---- options → files, environment, name ------------------------------------------------------

def _abs(path: str, base: str) -> str:
    path = os.path.expanduser(path)
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(base, path))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except FileNotFoundError:
        raise ComposeError("no such file") .located(path) from None
    except IsADirectoryError:
        raise ComposeError("is a directory, not a file").located(path) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise ComposeError(f"cannot read: {exc}").located(path) from None


def read_env_files(paths: List[str], current: Dict[str, str]) -> Dict[str, str]:
    """Dotenv files in order; a value may use variables of ``current`` and of earlier lines."""
    values: Dict[str, str] = {}
    for path in paths:
        if not os.path.exists(path):
            raise ComposeError("couldn't find env file").located(path)
        if os.path.isdir(path):
            raise ComposeError("is a directory, not an env file").located(path)
        try:
            dotenv.parse(_read(path), lambda k: current.get(k, values.get(k)), into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"invalid env file: {exc}").located(path) from None
    return {k: v for k, v in values.items() if not k[:1].isdigit()}


def _discover(start: str) -> List[str]:
    directory = start
    while True:
        found = [os.path.join(directory, n) for n in DEFAULT_FILES if os.path.isfile(os.path.join(directory, n))]
        if found:
            overrides = [os.path.join(directory, n) for n in OVERRIDE_FILES
                         if os.path.isfile(os.path.join(directory, n))]
            return found[:1] + overrides[:1]
        parent = os.path.dirname(directory)
        if parent == directory:
            raise ComposeError(f"no configuration file provided: not found in {start} or its parents "
                               f"(looked for {', '.join(DEFAULT_FILES)})")
        directory = parent


def normalize_project_name(name: str) -> str:
    kept = "".join(ch for ch in name.lower() if ch in "abcdefghijklmnopqrstuvwxyz0123456789_-")
    return kept.lstrip("_-")


def _checked_project_name(name: str) -> str:
    """A name given with -p or COMPOSE_PROJECT_NAME is used as given, so it must already be valid."""
    if normalize_project_name(name) != name:
        raise ComposeError(f"invalid project name {go_quote(name)}: must consist only of lowercase alphanumeric "
                           "characters, hyphens, and underscores as well as start with a letter or number")
    return name


def _defining_file(paths: List[str], key: str, separator: str = "=") -> Optional[str]:
    """The last of ``paths`` with a line that sets ``key`` (to name it in an error)."""
    pattern = re.compile(rf"^\s*(export\s+)?{re.escape(key)}\s*{separator}", re.MULTILINE)
    for path in reversed(paths):
        try:
            if pattern.search(_read(path)):
                return path
        except ComposeError:
            continue
    return None


def _name_from_files(files: List[str], lookup, ctx: _Context) -> Optional[str]:
    """The last `name:` of the files, normalised (it may then be empty); None when no file has one."""
    name = ""
    for path in files:
        for doc in ctx.documents_of(path):
            value = doc.data.get("name")
            if isinstance(value, str) and value:
                name = value
    if not name:
        return None
    return normalize_project_name(interpolate_tree({"name": name}, lookup)["name"])


# ---- per-file pipeline -----------------------------------------------------------------------

class _Loader:
    def __init__(self, ctx: _Context, environment: Dict[str, str], working_dir: str,
                 included: Tuple[str, ...] = ()):
        self.ctx = ctx
        self.environment = environment
        self.working_dir = working_dir
        self.included = included

    def lookup(self, name: str) -> Optional[str]:
        return self.environment.get(name)

    def load_model(self, files: List[str], resolve_paths: bool = True) -> Dict[str, Any]:
        model: Dict[str, Any] = {}
        for path in files:
            for doc in self.ctx.documents_of(path):
                try:
                    model = self._load_document(doc, model)
                except ComposeError as exc:
                    raise self.ctx.error_in(exc, doc) from None
        set_defaults(model)
        if resolve_paths:
            _resolve_paths(model, self.working_dir)
        _resolve_list_environment(model, self.environment)
        return model

    def _load_document(self, doc: Document, model: Dict[str, Any]) -> Dict[str, Any]:
        data, reset_paths = collect_resets(doc.data)
        data = interpolate_tree(data, self.lookup, self.ctx.unset_variable)
        if "include" in data:
            self._apply_include(data, doc)
        apply_resets(model, reset_paths)
        self._apply_extends(data, doc, reset_paths)
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

    def _apply_include(self, data: Dict[str, Any], doc: Document) -> None:
        entries = data.pop("include")
        if not isinstance(entries, list):
            raise ComposeError("`include` must be a list", path="include")
        for entry in entries:
            if isinstance(entry, str):
                entry = {"path": entry}
            if not isinstance(entry, dict) or "path" not in entry:
                raise ComposeError("an include entry needs a path", path="include")
            paths = entry["path"] if isinstance(entry["path"], list) else [entry["path"]]
            paths = [_abs(str(p), self.working_dir) for p in paths]
            project_dir = entry.get("project_directory")
            project_dir = _abs(str(project_dir), self.working_dir) if project_dir else os.path.dirname(paths[0])
            if paths[0] in self.included or paths[0] == doc.filename:
                chain = " include ".join(list(self.included) + [doc.filename, paths[0]])
                raise ComposeError(f"include cycle detected: {chain}", path="include")
            env_files = entry.get("env_file")
            if env_files is None:
                default = os.path.join(project_dir, ".env")
                env_paths = [default] if os.path.isfile(default) else []
            else:
                env_files = env_files if isinstance(env_files, list) else [env_files]
                env_paths = [_abs(str(f), self.working_dir) for f in env_files if f != "/dev/null"]
            from_files = read_env_files(env_paths, self.environment)
            environment = dict(from_files)
            environment.update(self.environment)  # the including project's values win
            sub = _Loader(self.ctx, environment, project_dir, self.included + (doc.filename,))
            imported = sub.load_model(paths)
            for kind in RESOURCE_KINDS:
                source = imported.get(kind)
                if not source:
                    continue
                target = data.setdefault(kind, {})
                if target is None:
                    target = data[kind] = {}
                for name, resource in source.items():
                    if name in target and target[name] != resource:
                        raise ComposeError("conflicts with a resource of the same name in an included project "
                                           f"({paths[0]})", path=f"{kind}.{name}")
                    target[name] = resource

    # -- extends --------------------------------------------------------------------------------

    def _apply_extends(self, data: Dict[str, Any], doc: Document, reset_paths) -> None:
        services = data.get("services")
        if not isinstance(services, dict):
            return
        for name in list(services):
            services[name] = self._extend(name, services, doc.filename, self.working_dir, reset_paths, ())

    def _extend(self, name: str, services: Dict[str, Any], filename: str, working_dir: str,
                reset_paths, chain: Tuple[Tuple[str, str], ...]) -> Any:
        service = services.get(name)
        if not isinstance(service, dict) or "extends" not in service:
            return service
        extends = service["extends"]
        if isinstance(extends, str):
            ref, other_file = extends, None
        elif isinstance(extends, dict) and isinstance(extends.get("service"), str):
            ref, other_file = extends["service"], extends.get("file")
        else:
            raise ComposeError("extends needs the name of a service", path=f"services.{name}.extends")
        if (filename, name) in chain:
            raise ComposeError(f"circular reference in extends of service {name!r}",
                               path=f"services.{name}.extends")
        chain = chain + ((filename, name),)
        base_services, base_file, base_dir = services, filename, working_dir
        if other_file is not None:
            base_file = _abs(str(other_file), working_dir)
            base_dir = os.path.dirname(base_file)
            base_model: Dict[str, Any] = {}
            for other in self.ctx.documents_of(base_file):
                other_data, _ = collect_resets(other.data)
                base_model = merge_mappings(base_model, interpolate_tree(other_data, self.lookup), ())
            base_model = canonical(enforce_unicity(base_model))
            base_services = base_model.get("services")
            if not isinstance(base_services, dict):
                raise ComposeError(f"cannot extend service {name!r}: {base_file} has no services section",
                                   path=f"services.{name}.extends")
            if ref not in base_services:
                raise ComposeError(f"cannot extend service {name!r}: service {ref!r} not found in {base_file}",
                                   path=f"services.{name}.extends")
            _resolve_paths(base_model, base_dir)
        elif ref not in services:
            raise ComposeError(f"cannot extend service {name!r}: service {ref!r} not found",
                               path=f"services.{name}.extends")
        base = self._extend(ref, base_services, base_file, base_dir, reset_paths, chain)
        if base is None:
            return service
        source = _clone(base)
        apply_resets({"services": {name: source}}, reset_paths)
        merged = merge(source, service, ("services", "x"))
        merged.pop("extends", None)
        services[name] = merged
        return merged


def _clone(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


# ---- project-wide passes --------------------------------------------------------------------

def _abs_path(value: Any, base: str) -> Any:
    if not isinstance(value, str) or value == "":
        return value
    if value.startswith("~"):  # Compose cleans a path it expanded or joined, and keeps an absolute one as written
        return os.path.normpath(os.path.expanduser(value))
    return value if os.path.isabs(value) else os.path.normpath(os.path.join(base, value))


def _is_remote_context(value: str) -> bool:
    return ("://" in value or value.startswith("service:") or
            value.startswith(("https://", "http://", "git://", "ssh://", "github.com/", "git@")))


def _resolve_paths(model: Dict[str, Any], base: str) -> None:
    for service in (model.get("services") or {}).values():
        if not isinstance(service, dict):
            continue
        build = service.get("build")
        if isinstance(build, dict):
            ctx = build.get("context")
            if isinstance(ctx, str) and not _is_remote_context(ctx):
                build["context"] = _abs_path(ctx, base)
            extra = build.get("additional_contexts")
            if isinstance(extra, dict):
                for key, value in extra.items():
                    if isinstance(value, str) and not _is_remote_context(value):
                        extra[key] = _abs_path(value, base)
        for env_file in service.get("env_file") or []:
            if isinstance(env_file, dict):
                env_file["path"] = _abs_path(env_file.get("path"), base)
        if isinstance(service.get("label_file"), list):
            service["label_file"] = [_abs_path(p, base) for p in service["label_file"]]
        extends = service.get("extends")
        if isinstance(extends, dict) and isinstance(extends.get("file"), str):
            extends["file"] = _abs_path(extends["file"], base)
        develop = service.get("develop")
        for watch in (develop.get("watch") or []) if isinstance(develop, dict) else ():
            if isinstance(watch, dict) and isinstance(watch.get("path"), str):
                watch["path"] = _abs_path(watch["path"], base)
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict) and volume.get("type") == "bind":
                if "source" not in volume:
                    raise ComposeError('invalid mount config for type "bind": field source must not be empty',
                                       path="services.volumes")
                volume["source"] = _abs_path(volume["source"], base)
    for kind in ("configs", "secrets"):
        for resource in (model.get(kind) or {}).values():
            if isinstance(resource, dict) and isinstance(resource.get("file"), str):
                resource["file"] = _abs_path(resource["file"], base)
    for volume in (model.get("volumes") or {}).values():
        if isinstance(volume, dict) and volume.get("driver") == "local":
            opts = volume.get("driver_opts")
            if isinstance(opts, dict) and opts.get("o") == "bind" and "device" in opts:
                opts["device"] = _abs_path(opts["device"], base)


def _resolve_list_environment(model: Dict[str, Any], environment: Dict[str, str]) -> None:
    for service in (model.get("services") or {}).values():
        if isinstance(service, dict) and isinstance(service.get("environment"), list):
            service["environment"] = [
                (f"{item}={environment[item]}" if isinstance(item, str) and item in environment else item)
                for item in service["environment"]]


def _environment_mapping(value: Any, path: str) -> Dict[str, Optional[str]]:
    """A service's environment (list or mapping) as a mapping; None marks a name without value."""
    from compose2sif.units import go_str
    if value is None:
        return {}
    if isinstance(value, dict):
        return {str(k): (None if v is None else v if isinstance(v, str) else go_str(v)) for k, v in value.items()}
    if isinstance(value, list):
        out: Dict[str, Optional[str]] = {}
        for item in value:
            key, sep, val = go_str(item).partition("=")
            if key and key[-1].isspace():
                raise ComposeError(f"environment variable {key!r} is declared with a trailing space", path=path)
            out[key] = val if sep else None
        return out
    raise ComposeError("environment must be a list or a mapping", path=path)


def _build_args(value: Any, environment: Dict[str, str], path: str) -> Dict[str, str]:
    """Build args as a mapping; a name without a value takes the environment's, or is left out
    (compose-go resolves them, then drops the unresolved ones)."""
    args = _environment_mapping(value, path)
    resolved = {k: (v if v is not None else environment.get(k)) for k, v in args.items()}
    return {k: v for k, v in resolved.items() if v is not None}


def _normalize(model: Dict[str, Any], name: str, environment: Dict[str, str]) -> None:
    services = model.get("services") or {}
    uses_default = False
    for service in services.values():
        if "provider" in service or "network_mode" in service:
            continue
        networks = service.get("networks")
        if not networks:
            service["networks"] = {"default": None}
            uses_default = True
        elif "default" in networks:
            uses_default = True
    if uses_default:
        networks = model.get("networks") or {}
        networks.setdefault("default", None)
        model["networks"] = networks
    for sname, service in services.items():
        build = service.get("build")
        if isinstance(build, dict):
            if build.get("context") is None:
                build["context"] = "."
            if build.get("dockerfile") is None and build.get("dockerfile_inline") is None:
                build["dockerfile"] = "Dockerfile"
            if "args" in build:
                build["args"] = _build_args(build["args"], environment, f"services.{sname}.build.args")
        env = _environment_mapping(service.get("environment"), f"services.{sname}.environment")
        if "environment" in service:
            service["environment"] = {k: (v if v is not None else environment.get(k)) for k, v in env.items()}
        depends_on = service.get("depends_on") or {}
        for link in service.get("links") or []:
            target = str(link).split(":")[0] if len(str(link).split(":")) == 2 else str(link)
            depends_on.setdefault(target, {"condition": "service_started", "restart": True, "required": True})
        for namespace in ("network_mode", "ipc", "pid", "uts", "cgroup"):
            ref = service.get(namespace)
            if isinstance(ref, str) and ref.startswith("service:"):
                depends_on.setdefault(ref[len("service:"):],
                                      {"condition": "service_started", "restart": True, "required": True})
        for volume in service.get("volumes") or []:
            if isinstance(volume, dict) and isinstance(volume.get("target"), str) and volume["target"]:
                volume["target"] = posixpath.normpath(volume["target"])
        for source in service.get("volumes_from") or []:
            if not str(source).startswith("container:"):
                depends_on.setdefault(str(source).split(":")[0],
                                      {"condition": "service_started", "restart": False, "required": True})
        if depends_on:
            service["depends_on"] = depends_on
    for kind in ("networks", "volumes", "configs", "secrets"):
        section = model.get(kind)
        if not isinstance(section, dict):
            continue
        for key, resource in section.items():
            resource = resource if isinstance(resource, dict) else {}
            if resource.get("name") is None:
                external = str(resource.get("external", "")).lower() in ("true", "1", "t")
                resource["name"] = key if external else f"{name}_{key}"
            section[key] = resource


def _has_profile(service: Dict[str, Any], profiles: List[str]) -> bool:
    own = service.get("profiles") or []
    return not own or "*" in profiles or any(p in own for p in profiles)


def _check_consistency(model: Dict[str, Any], disabled: Dict[str, Any]) -> None:
    services = model.get("services") or {}
    for name, service in services.items():
        where = f"services.{name}"
        if not service.get("image") and "build" not in service and "provider" not in service:
            raise ComposeError("has neither an image nor a build context specified", path=where)
        if service.get("network_mode") and "networks" in service:
            raise ComposeError("declares mutually exclusive `network_mode` and `networks`", path=where)
        for network in service.get("networks") or {}:
            if network not in (model.get("networks") or {}):
                raise ComposeError(f"refers to undefined network {network!r}", path=f"{where}.networks")
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test and test[0] not in ("CMD", "CMD-SHELL", "NONE"):
            raise ComposeError('healthcheck.test must start with "CMD", "CMD-SHELL" or "NONE"',
                               path=f"{where}.healthcheck.test")
        for dep, cfg in (service.get("depends_on") or {}).items():
            if dep in services:
                continue
            if dep in disabled and not cfg.get("required", True):
                continue
            state = "is disabled by profiles" if dep in disabled else "is not defined"
            raise ComposeError(f"depends on service {dep!r}, which {state}", path=f"{where}.depends_on")
        for volume in service.get("volumes") or []:
            if volume.get("type") == "volume" and volume.get("source"):
                if volume["source"] not in (model.get("volumes") or {}):
                    raise ComposeError(f"refers to undefined volume {volume['source']!r}", path=f"{where}.volumes")
        for kind in ("secrets", "configs"):
            for ref in service.get(kind) or []:
                source = ref.get("source") if isinstance(ref, dict) else ref
                if source not in (model.get(kind) or {}):
                    raise ComposeError(f"refers to undefined {kind[:-1]} {source!r}", path=f"{where}.{kind}")
        mounts: Dict[str, str] = {}
        for i, tmpfs in enumerate(_string_list(service.get("tmpfs"))):
            target = tmpfs.split(":")[0]
            if target in mounts:
                raise ComposeError(f"target {target} already mounted as {mounts[target]}", path=f"{where}.tmpfs")
            mounts[target] = f"{where}.tmpfs[{i}]"
        for i, volume in enumerate(service.get("volumes") or []):
            target = volume.get("target")
            if target in mounts:
                raise ComposeError(f"target {target} already mounted as {mounts[target]}", path=f"{where}.volumes")
            mounts[target] = f"{where}.volumes[{i}]"
        _check_resource_duplicates(name, service)
        replicas = service.get("scale") if service.get("scale") is not None else \
            (service.get("deploy") or {}).get("replicas") if isinstance(service.get("deploy"), dict) else None
        if service.get("container_name") and isinstance(replicas, int) and replicas > 1:
            attribute = "scale" if service.get("scale") is not None else "deploy.replicas"
            raise ComposeError(f"can't set container_name and {attribute} as container name must be unique",
                               path=where)
    for name, secret in (model.get("secrets") or {}).items():
        if isinstance(secret, dict) and not secret.get("external") and not secret.get("file") \
                and not secret.get("environment"):
            raise ComposeError(f"secret {go_quote(name)} must declare either `file` or `environment`",
                               path=f"secrets.{name}")
    _check_cycles(services)


def _check_resource_duplicates(name: str, service: Dict[str, Any]) -> None:
    """Keys that Compose reads as another spelling of a deploy setting must agree with it
    (compose-go's checkConsistency); values that do not parse are left to the encoder's errors."""
    from compose2sif.units import parse_bytes
    deploy = service.get("deploy")
    if not isinstance(deploy, dict):
        return
    resources = deploy.get("resources") if isinstance(deploy.get("resources"), dict) else {}

    def size(value):
        return parse_bytes(value) if value not in (None, "") else 0

    checks = (("scale", "deploy.replicas", deploy, "replicas", int),
              ("cpus", "deploy.resources.limits.cpus", resources.get("limits"), "cpus", float),
              ("mem_limit", "deploy.resources.limits.memory", resources.get("limits"), "memory", size),
              ("mem_reservation", "deploy.resources.reservations.memory", resources.get("reservations"), "memory",
               size),
              ("pids_limit", "deploy.resources.limits.pids", resources.get("limits"), "pids", int))
    for key, other, section, field_name, parse in checks:
        if service.get(key) is None or not isinstance(section, dict):
            continue
        try:
            mine = parse(service[key])
            theirs = parse(section.get(field_name) or 0)
        except (TypeError, ValueError):
            continue
        if key == "scale":
            if section.get(field_name) is not None and mine != theirs:
                raise ComposeError(f"can't set distinct values on '{key}' and '{other}'", path=f"services.{name}")
        elif mine and mine != theirs:
            raise ComposeError(f"can't set distinct values on '{key}' and '{other}'", path=f"services.{name}")


def _string_list(value: Any) -> List[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _check_cycles(services: Dict[str, Any]) -> None:
    """Depth-first over depends_on, without recursion (a chain may be thousands of services long)."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: done
    for start in services:
        if start in state:
            continue
        path = [start]
        pending = [iter(services[start].get("depends_on") or {})]
        state[start] = 1
        while pending:
            dep = next(pending[-1], None)
            if dep is None:
                state[path.pop()] = 2
                pending.pop()
                continue
            if dep not in services:
                continue
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise ComposeError("dependency cycle detected: " + " -> ".join(cycle),
                                   path=f"services.{path[-1]}.depends_on")
            if dep not in state:
                state[dep] = 1
                path.append(dep)
                pending.append(iter(services[dep].get("depends_on") or {}))


def _merge_env_files(service: Dict[str, Any], environment: Dict[str, str], path: str) -> None:
    env_files = service.pop("env_file", None) or []
    if not env_files:
        return
    own = service.get("environment") or {}
    values: Dict[str, str] = {}

    def lookup(key: str) -> Optional[str]:
        if key in environment:
            return environment[key]
        return own.get(key)

    for env_file in env_files:
        file_path = env_file.get("path")
        if not os.path.exists(file_path):
            if env_file.get("required", True):
                raise ComposeError(f"env file {file_path} not found", path=f"{path}.env_file")
            continue
        try:
            if env_file.get("format") == "raw":
                values.update(_raw_env_file(_read(file_path), environment))
            else:
                dotenv.parse(_read(file_path), lambda k: lookup(k) if lookup(k) is not None else values.get(k),
                             into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"failed to parse env_file {file_path}: {exc}", path=f"{path}.env_file") from None
    merged: Dict[str, Optional[str]] = dict(values)
    merged.update(own)
    service["environment"] = merged


def _raw_env_file(text: str, environment: Dict[str, str]) -> Dict[str, str]:
    """``format: raw``: docker's --env-file rules. Each ``KEY=VALUE`` line is taken as written (no
    quotes, comments or variables); a bare ``KEY`` takes the environment's value, if any."""
    values: Dict[str, str] = {}
    for line in text.lstrip("\ufeff").splitlines():
        line = line.lstrip(" \t")
        if not line or line.startswith("#"):
            continue
        key, found, value = line.partition("=")
        if not key:
            raise dotenv.DotenvError(f"no variable name on line '{line}'")
        if " " in key or "\t" in key:
            raise dotenv.DotenvError(f"variable '{key}' contains whitespaces")
        if found:
            values[key] = value
        elif key in environment:
            values[key] = environment[key]
    return values


def _merge_label_files(service: Dict[str, Any], environment: Dict[str, str], path: str) -> None:
    """``label_file``: dotenv files of labels, under the service's own labels (which win)."""
    label_files = service.pop("label_file", None) or []
    if not label_files:
        return
    values: Dict[str, str] = {}
    for file_path in label_files:
        try:
            dotenv.parse(_read(file_path), lambda k: environment.get(k, values.get(k)), into=values)
        except dotenv.DotenvError as exc:
            raise ComposeError(f"failed to parse label_file {file_path}: {exc}", path=f"{path}.label_file") from None
    own = service.get("labels") or {}
    if isinstance(own, list):
        own = dict((item.split("=", 1) + [""])[:2] for item in map(str, own))
    service["labels"] = {**values, **own}


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
    project_dir = _abs(options.project_directory, cwd) if options.project_directory else None

    files = [_abs(f, cwd) if f != "-" else f for f in options.files]
    if "-" in files:
        raise ComposeError("reading a compose file from standard input is not supported; pass a path")
    default_dir = project_dir or (os.path.dirname(files[0]) if files else cwd)

    if options.env_files:
        env_paths = [_abs(f, cwd) for f in options.env_files]
    elif str(environ.get("COMPOSE_DISABLE_ENV_FILE", "")).lower() in ("1", "true"):
        env_paths = []
    else:
        default_env = os.path.join(default_dir, ".env")
        env_paths = [default_env] if os.path.isfile(default_env) else []
    environment = dict(read_env_files(env_paths, environ))
    environment.update(environ)  # the host environment wins over .env

    if not files and environment.get("COMPOSE_FILE"):
        separator = environment.get("COMPOSE_PATH_SEPARATOR") or os.pathsep
        files = [_abs(f, cwd) for f in environment["COMPOSE_FILE"].split(separator) if f]
    if not files:
        files = _discover(default_dir)
    working_dir = project_dir or os.path.dirname(files[0])
    known_files.extend(files)

    ctx = _Context()
    if options.project_name:
        name = _checked_project_name(options.project_name)
    elif environment.get("COMPOSE_PROJECT_NAME"):
        try:
            name = _checked_project_name(environment["COMPOSE_PROJECT_NAME"])
        except ComposeError as exc:
            raise exc.located(None if "COMPOSE_PROJECT_NAME" in environ else _defining_file(
                env_paths, "COMPOSE_PROJECT_NAME")) from None
    else:
        name = _name_from_files(files, environment.get, ctx)
        if name is None:
            name = normalize_project_name(os.path.basename(working_dir))
        elif not name:
            raise ComposeError("project name must not be empty (`name:` has no letter or digit)").located(
                _defining_file(files, "name", separator=":"))
    if not name:
        raise ComposeError(f"project name must not be empty (the directory name "
                           f"{go_quote(os.path.basename(working_dir))} has no letter or digit); use -p or a `name:` key"
                           ).located(files[0])
    environment["COMPOSE_PROJECT_NAME"] = name

    profiles = list(options.profiles) or [p.strip() for p in environment.get("COMPOSE_PROFILES", "").split(",")]
    profiles = [p for p in profiles if p]

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
        _normalize(model, name, environment)
    except ComposeError as exc:
        raise _locate(exc, ctx) from None

    active = {n: s for n, s in services.items() if _has_profile(s, profiles)}
    disabled = {n: s for n, s in services.items() if n not in active}
    model["services"] = active
    try:
        _check_consistency(model, disabled)
        for sname, service in active.items():
            _merge_env_files(service, environment, f"services.{sname}")
            _merge_label_files(service, environment, f"services.{sname}")
        config = encode_project(model)  # also checks durations, sizes, counts
    except ComposeError as exc:
        raise _locate(exc, ctx) from None

    for sname, service in active.items():
        ctx.warnings.extend(unsupported_warnings(sname, service))

    return Project(name=name, working_dir=working_dir, files=files, environment=environment, model=model,
                   config=config, disabled=disabled, profiles=profiles, warnings=ctx.warnings, origins=ctx.origins)


def _locate(exc: ComposeError, ctx: _Context) -> ComposeError:
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

"""Dockerfile -> Singularity definition file, for services with ``build:``.

Apptainer copies ``%files`` before it runs ``%post``, while a Dockerfile interleaves COPY and RUN.
To keep the Dockerfile's order, the build context (and files from earlier stages) is staged into
the image with ``%files`` and each COPY/ADD becomes a ``cp`` at its place in ``%post``; the staging
directory is removed at the end. Destinations are relative to WORKDIR as in Docker, ARG defaults
are overridden by compose's ``build.args``, ENV applies to later RUNs and to the runtime, USER is
recorded (Apptainer runs everything as the caller; never `su`), and ENTRYPOINT/CMD become a
``%runscript`` with Docker's semantics (arguments replace CMD).
"""
from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from compose2sif.errors import ComposeError

STAGING = "/.c2s-build"


@dataclass
class Stage:
    name: str
    base: str
    files: List[Tuple[str, str]] = field(default_factory=list)       # (host path or stage path, staging path)
    from_stages: List[Tuple[str, str, str]] = field(default_factory=list)  # (stage, path in stage, staging path)
    post: List[str] = field(default_factory=list)
    environment: List[str] = field(default_factory=list)
    labels: Dict[str, str] = field(default_factory=dict)
    workdir: str = "/"
    entrypoint: Optional[List[str]] = None
    cmd: Optional[List[str]] = None
    entrypoint_shell: bool = False
    cmd_shell: bool = False
    user: Optional[str] = None
    exposed: List[int] = field(default_factory=list)


@dataclass
class ConvertedDockerfile:
    definition: str
    workdir: str
    exposed: List[int]
    user: Optional[str]
    warnings: List[str]


def _instructions(text: str) -> List[Tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuations joined and comments removed."""
    out: List[Tuple[int, str, str]] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buffer and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buffer and line.lstrip().startswith("#"):
            continue
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer += line
        parts = buffer.strip().split(None, 1)
        out.append((start, parts[0].upper(), parts[1] if len(parts) > 1 else ""))
        buffer = ""
    if buffer:
        parts = buffer.strip().split(None, 1)
        out.append((start, parts[0].upper(), parts[1] if len(parts) > 1 else ""))
    return out


def _exec_form(args: str) -> Optional[List[str]]:
    stripped = args.strip()
    if stripped.startswith("["):
        try:
            value = json.loads(stripped)
        except ValueError:
            return None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return None


def _quote(argv: List[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _expand(text: str, variables: Dict[str, str]) -> str:
    """Docker's build-time substitution of $VAR / ${VAR} / ${VAR:-default} in instructions."""
    def repl(m):
        name = m.group(1) or m.group(2)
        default = m.group(4)
        value = variables.get(name)
        if m.group(3) == ":-":
            return value if value else (default or "")
        if m.group(3) == ":+":
            return (default or "") if value else ""
        return value or ""
    return re.sub(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\+)([^}]*))?\})", repl, text)


def _flags(args: str) -> Tuple[Dict[str, str], str]:
    flags: Dict[str, str] = {}
    while args.startswith("--"):
        token, _, rest = args.partition(" ")
        key, _, value = token[2:].partition("=")
        flags[key] = value
        args = rest.lstrip()
    return flags, args


def _key_values(args: str) -> List[Tuple[str, str]]:
    if "=" not in args.split(None, 1)[0]:
        key, _, value = args.partition(" ")
        return [(key, value.strip())]
    pairs = []
    for token in shlex.split(args):
        key, _, value = token.partition("=")
        pairs.append((key, value))
    return pairs


def convert(dockerfile: str, context: str, build_args: Dict[str, Optional[str]], target: Optional[str],
            where: str, image_ref=lambda image: image) -> ConvertedDockerfile:
    """Convert Dockerfile text. ``context`` is the absolute build context directory;
    ``image_ref`` maps a FROM image to the reference to pull (a registry mirror)."""
    warnings: List[str] = []
    stages: List[Stage] = []
    global_args: Dict[str, str] = {}
    declared: Dict[str, str] = {}
    env: Dict[str, str] = {}
    stage: Optional[Stage] = None
    staged = 0

    def variables() -> Dict[str, str]:
        return {**declared, **env}

    for line, op, args in _instructions(dockerfile):
        if op == "ARG":
            for key, value in _key_values(args) if "=" in args else [(args.strip(), "")]:
                given = build_args.get(key)
                resolved = given if given is not None else (global_args.get(key, value) if stage else value)
                if stage is None:
                    global_args[key] = resolved
                else:
                    declared[key] = resolved
                    stage.post.append(f"export {key}={shlex.quote(resolved)}")
            continue
        if op == "FROM":
            flags, rest = _flags(args)
            parts = rest.split()
            base = _expand(parts[0], global_args)
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(len(stages))
            known = {s.name: s for s in stages}
            stage = Stage(name=name, base=base)
            if base in known:  # FROM an earlier stage: start from its recipe
                parent = known[base]
                stage.base, stage.files = parent.base, list(parent.files)
                stage.from_stages = list(parent.from_stages)
                stage.post, stage.environment = list(parent.post), list(parent.environment)
                stage.workdir = parent.workdir
            stages.append(stage)
            declared, env = {}, {}
            continue
        if stage is None:
            raise ComposeError(f"{where}: line {line}: {op} before FROM")
        if op == "RUN":
            flags, rest = _flags(args)
            argv = _exec_form(rest)
            stage.post.append(_quote(argv) if argv is not None else rest)
        elif op in ("COPY", "ADD"):
            flags, rest = _flags(args)
            argv = _exec_form(rest) or shlex.split(rest)
            if len(argv) < 2:
                raise ComposeError(f"{where}: line {line}: {op} needs a source and a destination")
            *sources, dest = [_expand(a, variables()) for a in argv]
            into_dir = dest.endswith(("/", "/.")) or dest in (".", "..") or len(sources) > 1
            dest = os.path.normpath(dest if dest.startswith("/") else os.path.join(stage.workdir, dest))
            quoted = shlex.quote(dest)
            stage.post.append(f"mkdir -p {quoted if into_dir else shlex.quote(os.path.dirname(dest))}")
            for source in sources:
                if re.match(r"https?://", source):
                    target = os.path.join(dest, os.path.basename(source)) if into_dir else dest
                    stage.post.append(f"curl -fsSL -o {shlex.quote(target)} {shlex.quote(source)}")
                    continue
                staged += 1
                # staged under its own name, so that a file copied into a directory keeps it
                name = os.path.basename(os.path.normpath(source)) or "context"
                staging = f"{STAGING}/{staged}/{name}"
                if flags.get("from"):
                    stage.from_stages.append((flags["from"], source, staging))
                else:
                    host = os.path.normpath(os.path.join(context, source))
                    if host != os.path.normpath(context) and not host.startswith(os.path.normpath(context) + os.sep):
                        raise ComposeError(f"{where}: line {line}: {source} is outside the build context")
                    if any(ch in source for ch in "*?["):
                        warnings.append(f"{where}: line {line}: wildcards in {op} are not expanded")
                    stage.files.append((host, staging))
                if op == "ADD" and re.search(r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz)$", source) and not flags.get("from"):
                    stage.post.append(f"mkdir -p {quoted} && tar -xf {staging} -C {quoted}")
                elif into_dir:
                    stage.post.append(f"if [ -d {staging} ]; then cp -a {staging}/. {quoted}/; "
                                      f"else cp -a {staging} {quoted}/; fi")
                else:
                    stage.post.append(f"if [ -d {staging} ]; then mkdir -p {quoted} && cp -a {staging}/. {quoted}/; "
                                      f"else cp -a {staging} {quoted}; fi")
            if flags.get("chown") or flags.get("chmod"):
                warnings.append(f"{where}: line {line}: {op} --chown/--chmod ignored (files belong to the caller)")
        elif op == "ENV":
            for key, value in _key_values(args):
                value = _expand(value, variables())
                env[key] = value
                stage.post.append(f"export {key}={shlex.quote(value)}")
                stage.environment.append(f"export {key}={shlex.quote(value)}")
        elif op == "WORKDIR":
            path = _expand(args.strip(), variables())
            stage.workdir = path if path.startswith("/") else os.path.join(stage.workdir, path)
            stage.post.append(f"mkdir -p {shlex.quote(stage.workdir)} && cd {shlex.quote(stage.workdir)}")
        elif op == "USER":
            stage.user = args.strip()
        elif op in ("ENTRYPOINT", "CMD"):
            argv = _exec_form(args)
            shell = argv is None
            value = argv if argv is not None else [args.strip()]
            if op == "ENTRYPOINT":
                stage.entrypoint, stage.entrypoint_shell = value, shell
                stage.cmd, stage.cmd_shell = None, False  # Docker resets CMD when ENTRYPOINT is set
            else:
                stage.cmd, stage.cmd_shell = value, shell
        elif op == "EXPOSE":
            for token in args.split():
                port = token.split("/")[0]
                if port.isdigit():
                    stage.exposed.append(int(port))
        elif op == "LABEL":
            for key, value in _key_values(args):
                stage.labels[key] = value
        elif op in ("HEALTHCHECK", "STOPSIGNAL", "VOLUME", "MAINTAINER"):
            pass  # compose's healthcheck / stop_signal / volumes apply instead
        elif op in ("SHELL", "ONBUILD"):
            warnings.append(f"{where}: line {line}: {op} is not supported and was ignored")
        else:
            raise ComposeError(f"{where}: line {line}: unknown Dockerfile instruction {op}")
    if not stages:
        raise ComposeError(f"{where}: no FROM instruction")
    final = stages[-1]
    if target:
        matching = [s for s in stages if s.name == target]
        if not matching:
            raise ComposeError(f"{where}: build target {target!r} is not a stage of the Dockerfile")
        final = matching[0]
    needed = _needed_stages(stages, final)
    for stage in needed:
        if stage.base != "scratch":
            stage.base = image_ref(stage.base)
    return ConvertedDockerfile(definition=_render(needed, final), workdir=final.workdir,
                               exposed=final.exposed, user=final.user, warnings=warnings)


def _needed_stages(stages: List[Stage], final: Stage) -> List[Stage]:
    by_name = {s.name: s for s in stages}
    needed, todo = [], [final]
    while todo:
        stage = todo.pop()
        if stage in needed:
            continue
        needed.append(stage)
        for source, _, _ in stage.from_stages:
            if source in by_name:
                todo.append(by_name[source])
    return [s for s in stages if s in needed]


def _bootstrap(base: str) -> str:
    if base == "scratch":
        raise ComposeError("FROM scratch images cannot be built into a SIF without a base")
    return f"Bootstrap: docker\nFrom: {base}\n"


def _runscript(stage: Stage) -> List[str]:
    entry, cmd = stage.entrypoint, stage.cmd
    if entry and stage.entrypoint_shell:
        return [f"exec /bin/sh -c {shlex.quote(entry[0])}"]
    if entry:
        default = ("" if not cmd else " " + (f"/bin/sh -c {shlex.quote(cmd[0])}" if stage.cmd_shell else _quote(cmd)))
        return [f'if [ "$#" -gt 0 ]; then exec {_quote(entry)} "$@"; fi', f"exec {_quote(entry)}{default}"]
    if cmd:
        run = f"/bin/sh -c {shlex.quote(cmd[0])}" if stage.cmd_shell else _quote(cmd)
        return ['if [ "$#" -gt 0 ]; then exec "$@"; fi', f"exec {run}"]
    return ['if [ "$#" -gt 0 ]; then exec "$@"; fi', "exec /bin/sh"]


def _render(stages: List[Stage], final: Stage) -> str:
    out: List[str] = []
    for stage in stages:
        out.append(_bootstrap(stage.base) + f"Stage: {_stage_label(stage.name)}\n")
        if stage.files:
            out.append("%files")
            out += [f"    {host} {staging}" for host, staging in stage.files]
            out.append("")
        for source_stage in sorted({s for s, _, _ in stage.from_stages}):
            out.append(f"%files from {_stage_label(source_stage)}")
            out += [f"    {path} {staging}" for s, path, staging in stage.from_stages if s == source_stage]
            out.append("")
        out.append("%post")
        out.append(f"    mkdir -p {shlex.quote(STAGING)}")
        out += [f"    {line}" for line in stage.post]
        out.append(f"    rm -rf {shlex.quote(STAGING)}")
        out.append("")
        if stage is final:
            if stage.environment:
                out.append("%environment")
                out += [f"    {line}" for line in stage.environment]
                out.append("")
            if stage.labels:
                out.append("%labels")
                out += [f"    {k} {v}" for k, v in stage.labels.items()]
                out.append("")
            out.append("%runscript")
            out.append(f"    cd {shlex.quote(stage.workdir)} 2>/dev/null || true")
            out += [f"    {line}" for line in _runscript(stage)]
            out.append("")
    return "\n".join(out)


def _stage_label(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name if not name.isdigit() else f"stage{name}")

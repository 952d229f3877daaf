"""Dockerfile -> Singularity definition file, for services with ``build:``.

Apptainer copies ``%files`` before it runs ``%post``, while a Dockerfile interleaves COPY and RUN.
To keep the Dockerfile's order, the build context (and files from earlier stages) is staged into
the image with ``%files`` and each COPY/ADD becomes a ``cp`` at its place in ``%post``; the staging
directory is removed at the end. Destinations are relative to WORKDIR as in Docker, ARG defaults
are overridden by compose's ``build.args``, ENV applies to later RUNs and to the runtime, USER is
recorded (Apptainer runs everything as the caller; never `su`), and ENTRYPOINT/CMD become a
``%runscript`` with Docker's semantics (arguments replace CMD).

Values are data. Apptainer starts a new section at any line whose first word begins with ``%``
(and a new stage at a line starting ``Bootstrap:``), so every line written into a section goes
through ``_body_line``, every value through ``sh_quote`` (which never lets a value's newline start
a line of its own), and every header value through ``header_value``. A malformed Dockerfile is one
error line naming the Dockerfile and the line, never a crash.
"""
from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from compose2sif.errors import ComposeError
from compose2sif.model import Healthcheck, healthcheck_of
from compose2sif.units import parse_duration

STAGING = "/.c2s-build"
IMAGE_STAGE = "c2s-image-"  # a stage made for COPY --from=IMAGE
# the base image's runscript (Apptainer writes it from the image's ENTRYPOINT and CMD before %post),
# kept for a CMD without an ENTRYPOINT of the Dockerfile's own
BASE_RUNSCRIPT = "/.singularity.d/c2s-base-runscript"
DEFAULT_SHELL = ["/bin/sh", "-c"]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HEREDOC = re.compile(r"<<(-?)(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def sh_quote(value: str) -> str:
    """A shell word for ``value``. A newline is written as a double-quoted newline, so the next
    line of the definition starts with ``"`` and can never be read as a ``%section``. ``{{`` is
    written ``{''{`` (the same word: every ``{`` that shlex.quote leaves is inside single quotes),
    so that Apptainer's ``{{ NAME }}`` build-argument templating never sees a value."""
    return '"\n"'.join(shlex.quote(part).replace("{{", "{''{") for part in value.split("\n"))


def _quote(argv: List[str]) -> str:
    return " ".join(sh_quote(a) for a in argv)


def header_value(value: str, what: str, path: Optional[str] = None) -> str:
    """A value for a definition header line (``From:``): one line, no comment, no continuation."""
    if _CONTROL.search(value) or "#" in value or value.rstrip().endswith("\\") or not value.strip():
        raise ComposeError(f"{what} {value!r} cannot be written into a definition header "
                           "(empty, a control character, '#' or a trailing backslash)", path=path)
    return value


def comment_text(value: str) -> str:
    """Text for a ``#`` comment line of a definition: control characters shown as ``?``."""
    return _CONTROL.sub("?", value)


def _body_line(line: str) -> str:
    """One line of a shell section. A line whose first word starts with ``%`` would begin a new
    section; ``""`` in front of it changes nothing for the shell."""
    out = []
    for part in line.split("\n"):
        out.append('""' + part if part.lstrip().startswith("%") else part)
    return "    " + "\n".join(out)


def _files_path(path: str, where: str) -> str:
    """A path in a %files line: Apptainer splits it at white space outside double quotes."""
    if _CONTROL.search(path) or '"' in path:
        raise ComposeError(f"{where}: the path {path!r} cannot be staged into the image "
                           "(a control character or '\"')")
    return f'"{path}"' if re.search(r"[\s'{}%#]", path) or path.startswith("%") else path


@dataclass
class Stage:
    name: str
    base: str
    bootstrap: str = "docker"  # localimage: FROM an image another service of the project builds
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
    shell: List[str] = field(default_factory=lambda: list(DEFAULT_SHELL))
    user: Optional[str] = None
    exposed: List[int] = field(default_factory=list)
    volumes: List[str] = field(default_factory=list)
    stop_signal: Optional[str] = None
    healthcheck: Optional[Healthcheck] = None


@dataclass
class ConvertedDockerfile:
    definition: str
    workdir: str
    exposed: List[int]
    user: Optional[str]
    warnings: List[str]
    volumes: List[str] = field(default_factory=list)
    cmd: Optional[List[str]] = None   # the final stage's CMD in exec form (the runscript's default arguments)
    stop_signal: Optional[str] = None  # the final stage's STOPSIGNAL (`down` sends it where compose sets none)
    healthcheck: Optional[Healthcheck] = None  # the final stage's HEALTHCHECK (used where compose sets no test)


@dataclass
class Instruction:
    line: int
    op: str
    args: str
    heredocs: List[str] = field(default_factory=list)  # bodies of <<WORD documents, in order


def parse(text: str, where: str) -> List[Instruction]:
    """Instructions with continuations joined, comments removed and heredoc bodies collected.
    Lines end at "\\n" only, as in Docker's parser."""
    lines = [raw[:-1] if raw.endswith("\r") else raw for raw in text.split("\n")]
    out: List[Instruction] = []
    buffer, start, number = "", 0, 0
    while number < len(lines):
        raw = lines[number]
        number += 1
        stripped = raw.strip()
        if not buffer and (not stripped or stripped.startswith("#")):
            continue
        if buffer and stripped.startswith("#"):
            continue
        if not buffer:
            start = number
        if raw.rstrip().endswith("\\"):
            buffer += raw.rstrip()[:-1] + " "
            continue
        buffer += raw
        parts = buffer.strip().split(None, 1)
        buffer = ""
        if not parts:  # a continuation that ended in nothing
            continue
        instruction = Instruction(start, parts[0].upper(), parts[1] if len(parts) > 1 else "")
        if instruction.op in ("RUN", "COPY", "ADD"):
            for strip_tabs, _, word in _HEREDOC.findall(instruction.args):
                body = []
                while True:
                    if number >= len(lines):
                        raise ComposeError(f"{where}: line {start}: the heredoc <<{word} never ends")
                    line = lines[number]
                    number += 1
                    if (line.lstrip("\t") if strip_tabs else line) == word:
                        break
                    body.append(line.lstrip("\t") if strip_tabs else line)
                instruction.heredocs.append("".join(b + "\n" for b in body))
        out.append(instruction)
    if buffer.strip():
        parts = buffer.strip().split(None, 1)
        out.append(Instruction(start, parts[0].upper(), parts[1] if len(parts) > 1 else ""))
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


_VARIABLE = re.compile(r"\\(\$)|\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\+|-|\+)([^}]*))?\})")


def expand(text: str, variables: Dict[str, Optional[str]], missing: Optional[List[str]] = None) -> str:
    """Docker's build-time substitution of $VAR, ${VAR}, ${VAR:-word}, ${VAR-word}, ${VAR:+word},
    ${VAR+word}; ``\\$`` is a literal ``$``. Names with no value are appended to ``missing``."""
    def repl(m):
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(3)
        operator, word = m.group(4), m.group(5) or ""
        value = variables.get(name)
        if operator == ":-":
            return value if value else word
        if operator == "-":
            return value if value is not None else word
        if operator == ":+":
            return word if value else ""
        if operator == "+":
            return word if value is not None else ""
        if not value and missing is not None:
            missing.append(name)
        return value or ""
    return _VARIABLE.sub(repl, text)


def _flags(args: str) -> Tuple[Dict[str, str], str]:
    flags: Dict[str, str] = {}
    while args.startswith("--"):
        token, _, rest = args.partition(" ")
        key, _, value = token[2:].partition("=")
        flags[key] = value
        args = rest.lstrip()
    return flags, args


class _Converter:
    """State of one conversion; ``fail`` makes the one-line error naming the Dockerfile and line."""

    def __init__(self, where: str, context: str, build_args: Dict[str, Optional[str]]):
        self.where, self.context, self.build_args = where, context, build_args
        self.warnings: List[str] = []
        self.stages: List[Stage] = []
        self.global_args: Dict[str, Optional[str]] = {}
        self.declared: Dict[str, Optional[str]] = {}
        self.env: Dict[str, str] = {}
        self.stage: Optional[Stage] = None
        self.staged = 0
        self.line = 0

    def fail(self, message: str) -> ComposeError:
        return ComposeError(f"{self.where}: line {self.line}: {message}")

    def warn(self, message: str) -> None:
        self.warnings.append(f"{self.where}: line {self.line}: {message}")

    def variables(self) -> Dict[str, Optional[str]]:
        return {**self.declared, **self.env}

    def split(self, args: str) -> List[str]:
        try:
            return shlex.split(args)
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            raise self.fail(f"cannot split {args!r}: {str(exc).lower()}") from None

    def key_values(self, op: str, args: str) -> List[Tuple[str, str]]:
        """ENV/LABEL arguments: `KEY value` (old form) or `KEY=value ...` with quotes."""
        if not args.strip():
            raise self.fail(f"{op} needs KEY=value")
        first = args.split(None, 1)[0]
        if "=" not in first:
            key, _, value = args.partition(" ")
            value = value.strip()
            if not value:
                raise self.fail(f"{op} {key} has no value")
            return [(key, " ".join(self.split(value)) if value[:1] in "'\"" else value)]
        pairs = []
        for token in self.split(args):
            key, sep, value = token.partition("=")
            if not sep or not key:
                raise self.fail(f"{op}: expected KEY=value, not {token!r}")
            pairs.append((key, value))
        return pairs

    def instruction(self, ins: Instruction) -> None:
        self.line = ins.line
        op, args = ins.op, ins.args
        if op == "ARG":
            self.arg(args)
            return
        if op == "FROM":
            self.from_(args)
            return
        stage = self.stage
        if stage is None:
            raise self.fail(f"{op} before FROM")
        if op == "RUN":
            _, rest = _flags(args)
            if ins.heredocs:
                if not _HEREDOC.fullmatch(rest.strip()) or len(ins.heredocs) != 1:
                    raise self.fail("only a plain `RUN <<WORD` heredoc is supported")
                stage.post.append(_quote(stage.shell + [ins.heredocs[0]]))
                return
            argv = _exec_form(rest)
            if argv is not None:
                stage.post.append(_quote(argv))
            elif stage.shell != DEFAULT_SHELL:
                stage.post.append(_quote(stage.shell + [rest]))
            elif rest.strip():
                stage.post.append(rest)
        elif op in ("COPY", "ADD"):
            self.copy(op, args, ins.heredocs)
        elif op == "ENV":
            for key, value in self.key_values(op, args):
                value = expand(value, self.variables())
                self.env[key] = value
                if not _NAME.match(key):
                    self.warn(f"ENV {key!r} is not a shell variable name; not exported")
                    continue
                stage.post.append(f"export {key}={sh_quote(value)}")
                stage.environment.append(f"export {key}={sh_quote(value)}")
        elif op == "WORKDIR":
            path = expand(args.strip(), self.variables())
            if not path:
                raise self.fail("WORKDIR needs a path")
            stage.workdir = os.path.normpath(path if path.startswith("/") else os.path.join(stage.workdir, path))
            stage.post.append(f"mkdir -p {sh_quote(stage.workdir)} && cd {sh_quote(stage.workdir)}")
        elif op == "USER":
            stage.user = expand(args.strip(), self.variables()) or None
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
            for token in expand(args, self.variables()).split():
                port = token.split("/")[0]
                if port.isdigit() and not token.endswith("/udp"):
                    stage.exposed.append(int(port))
        elif op == "LABEL":
            for key, value in self.key_values(op, args):
                if not _LABEL_KEY.match(key):
                    self.warn(f"LABEL {key!r} is not kept (only letters, digits and ._/- in label names)")
                    continue
                # metadata only: one line, and no {{ NAME }} for Apptainer's templating
                stage.labels[key] = comment_text(expand(value, self.variables())).replace("{{", "{ {")
        elif op == "SHELL":
            argv = _exec_form(args)
            if not argv:
                raise self.fail('SHELL needs the JSON form, e.g. SHELL ["/bin/bash", "-c"]')
            stage.shell = argv
        elif op == "VOLUME":  # each becomes an anonymous volume of the services built from it
            paths = _exec_form(args)
            for path in paths if paths is not None else expand(args, self.variables()).split():
                path = expand(path, self.variables()) if paths is not None else path
                if path.startswith("/") and path not in stage.volumes:
                    stage.volumes.append(os.path.normpath(path))
        elif op == "STOPSIGNAL":
            stage.stop_signal = expand(args.strip(), self.variables()) or None
        elif op == "HEALTHCHECK":
            stage.healthcheck = self.healthcheck(args)
        elif op == "MAINTAINER":
            pass
        elif op == "ONBUILD":
            self.warn("ONBUILD is not supported and was ignored")
        else:
            raise self.fail(f"unknown Dockerfile instruction {op[:40] if op.isprintable() else repr(op[:40])}")

    def healthcheck(self, args: str) -> Healthcheck:
        """HEALTHCHECK [--interval=D --timeout=D --start-period=D --start-interval=D --retries=N] CMD
        command, or HEALTHCHECK NONE (Docker expands no variables in it)."""
        rest, seconds, retries = args.strip(), {}, 0
        while rest.startswith("--"):
            option, _, rest = rest.partition(" ")
            rest = rest.lstrip()
            key, _, value = option[2:].partition("=")
            try:
                if key == "retries":
                    retries = int(value)
                elif key in ("interval", "timeout", "start-period", "start-interval"):
                    seconds[key.replace("-", "_")] = parse_duration(value) / 1e9
                else:
                    raise ValueError(key)
            except (ValueError, ComposeError):
                raise self.fail(f"HEALTHCHECK option {option[:60]!r} is not one Docker knows, or its value is "
                                "not valid") from None
        word, _, command = rest.partition(" ")
        if word.upper() == "NONE" and not command.strip():
            return healthcheck_of(["NONE"], {}, 0)
        if word.upper() != "CMD" or not command.strip():
            raise self.fail("HEALTHCHECK needs CMD and a command, or NONE")
        argv = _exec_form(command)
        return healthcheck_of(["CMD", *argv] if argv is not None else ["CMD-SHELL", command.strip()], seconds, retries)

    def arg(self, args: str) -> None:
        if not args.strip():
            raise self.fail("ARG needs a name")
        for token in self.split(args):
            key, sep, default = token.partition("=")
            if not _NAME.match(key):
                raise self.fail(f"ARG {key!r} is not a valid name")
            given = self.build_args.get(key)
            if self.stage is None:
                value = given if given is not None else (expand(default, self.global_args) if sep else None)
                self.global_args[key] = value
                continue
            if given is not None:
                value = given
            elif sep:
                value = expand(default, self.variables())
            else:
                value = self.global_args.get(key)
            self.declared[key] = value
            if value is not None:
                self.stage.post.append(f"export {key}={sh_quote(value)}")

    def from_(self, args: str) -> None:
        _, rest = _flags(args)
        parts = rest.split()
        if not parts:
            raise self.fail("FROM needs an image")
        if len(parts) not in (1, 3) or len(parts) == 3 and parts[1].upper() != "AS":
            raise self.fail(f"expected FROM IMAGE [AS NAME], not FROM {rest}")
        missing: List[str] = []
        base = expand(parts[0], self.global_args, missing)
        if not base or "$" in base or base.endswith((":", "@")) or base.startswith(("/", ":", "@")):
            unset = ", ".join(f"ARG {name}" for name in dict.fromkeys(missing))
            reason = f"{unset} has no value" if unset else "it is not an image reference"
            raise self.fail(f"FROM {parts[0]} expands to {base!r}: {reason} (set it in build.args or give the "
                            "ARG a default before FROM)")
        name = parts[2] if len(parts) == 3 else str(sum(1 for s in self.stages if not s.name.startswith(IMAGE_STAGE)))
        known = {s.name: s for s in self.stages}
        stage = Stage(name=name, base=base)
        if base in known:  # FROM an earlier stage: start from its recipe
            parent = known[base]
            stage.base, stage.files = parent.base, list(parent.files)
            stage.from_stages = list(parent.from_stages)
            stage.post, stage.environment = list(parent.post), list(parent.environment)
            stage.workdir, stage.shell = parent.workdir, list(parent.shell)
            stage.entrypoint, stage.cmd = parent.entrypoint, parent.cmd
            stage.entrypoint_shell, stage.cmd_shell = parent.entrypoint_shell, parent.cmd_shell
            stage.stop_signal, stage.healthcheck = parent.stop_signal, parent.healthcheck
        else:
            header_value(base, f"{self.where}: line {self.line}: FROM image")
        self.stages.append(stage)
        self.stage = stage
        self.declared, self.env = {}, {}

    def source_stage(self, name: str) -> str:
        """The stage that COPY --from=NAME reads: an earlier stage by name or number, or an image,
        which becomes a stage of its own (Apptainer copies %files from stages only)."""
        named = [s for s in self.stages if not s.name.startswith(IMAGE_STAGE)]
        if name.isdigit() and int(name) < len(named):
            return named[int(name)].name
        if any(s.name == name for s in self.stages):
            return name
        for stage in self.stages:
            if stage.name.startswith(IMAGE_STAGE) and stage.base == name:
                return stage.name
        header_value(name, f"{self.where}: line {self.line}: COPY --from image")
        stage = Stage(name=f"{IMAGE_STAGE}{len(self.stages)}", base=name)
        self.stages.insert(self.stages.index(self.stage), stage)
        return stage.name

    def copy(self, op: str, args: str, heredocs: List[str]) -> None:
        stage = self.stage
        flags, rest = _flags(args)
        if heredocs:
            argv = self.split(_HEREDOC.sub("", rest))
            if len(argv) != 1 or len(heredocs) != 1:
                raise self.fail(f"only `{op} <<WORD DEST` is supported with a heredoc")
            dest = expand(argv[0], self.variables())
            dest = os.path.normpath(dest if dest.startswith("/") else os.path.join(stage.workdir, dest))
            stage.post.append(f"mkdir -p {sh_quote(os.path.dirname(dest))} && "
                              f"printf %s {sh_quote(heredocs[0])} > {sh_quote(dest)}")
            return
        argv = _exec_form(rest) or self.split(rest)
        if len(argv) < 2:
            raise self.fail(f"{op} needs a source and a destination")
        *sources, dest = [expand(a, self.variables()) for a in argv]
        into_dir = dest.endswith(("/", "/.")) or dest in (".", "..") or len(sources) > 1
        dest = os.path.normpath(dest if dest.startswith("/") else os.path.join(stage.workdir, dest))
        quoted = sh_quote(dest)
        stage.post.append(f"mkdir -p {quoted if into_dir else sh_quote(os.path.dirname(dest))}")
        source_stage = self.source_stage(expand(flags["from"], self.global_args)) if flags.get("from") else None
        here = f"{self.where}: line {self.line}"
        for source in sources:
            if re.match(r"https?://", source):
                target = os.path.join(dest, os.path.basename(source)) if into_dir else dest
                stage.post.append(f"curl -fsSL -o {sh_quote(target)} {sh_quote(source)}")
                continue
            self.staged += 1
            # staged under its own name, so that a file copied into a directory keeps it
            name = os.path.basename(os.path.normpath(source)) or "context"
            staging = f"{STAGING}/{self.staged}/{name}"
            if source_stage:
                stage.from_stages.append((source_stage, _files_path(source, here), _files_path(staging, here)))
            else:
                host = os.path.normpath(os.path.join(self.context, source))
                context = os.path.normpath(self.context)
                if host != context and not host.startswith(context + os.sep):
                    raise self.fail(f"{source} is outside the build context")
                if any(ch in source for ch in "*?["):
                    self.warn(f"wildcards in {op} are not expanded")
                stage.files.append((_files_path(host, here), _files_path(staging, here)))
            staged_q = sh_quote(staging)
            if op == "ADD" and re.search(r"\.(tar|tar\.gz|tgz|tar\.bz2|tar\.xz)$", source) and not source_stage:
                stage.post.append(f"mkdir -p {quoted} && tar -xf {staged_q} -C {quoted}")
            elif into_dir:
                stage.post.append(f"if [ -d {staged_q} ]; then cp -a {staged_q}/. {quoted}/; "
                                  f"else cp -a {staged_q} {quoted}/; fi")
            else:
                stage.post.append(f"if [ -d {staged_q} ]; then mkdir -p {quoted} && cp -a {staged_q}/. {quoted}/; "
                                  f"else cp -a {staged_q} {quoted}; fi")
        if flags.get("chown") or flags.get("chmod"):
            self.warn(f"{op} --chown/--chmod ignored (files belong to the caller)")


def convert(dockerfile: str, context: str, build_args: Dict[str, Optional[str]], target: Optional[str],
            where: str, image_ref=lambda image: image, local_image=lambda image: None) -> ConvertedDockerfile:
    """Convert Dockerfile text. ``context`` is the absolute build context directory;
    ``image_ref`` maps a FROM image to the reference to pull (a registry mirror); ``local_image``
    gives the SIF of a FROM (or COPY --from) image that the project builds itself, else None."""
    converter = _Converter(where, context, build_args)
    for ins in parse(dockerfile, where):
        converter.instruction(ins)
    stages = converter.stages
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
        if stage.base == "scratch":
            raise ComposeError(f"{where}: stage {stage.name} is FROM scratch, which cannot be built into a SIF "
                               "without a base image")
        sif = local_image(stage.base)
        if sif:
            stage.bootstrap, stage.base = "localimage", header_value(sif, f"{where}: FROM image")
        else:
            stage.base = header_value(image_ref(stage.base), f"{where}: FROM image")
    return ConvertedDockerfile(definition=_render(needed, final), workdir=final.workdir,
                               exposed=final.exposed, user=final.user, warnings=converter.warnings,
                               volumes=final.volumes, cmd=None if final.cmd_shell else final.cmd,
                               stop_signal=final.stop_signal, healthcheck=final.healthcheck)


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


def _runscript(stage: Stage) -> List[str]:
    """The %runscript lines of the final stage, with Docker's semantics: arguments replace CMD.
    Without an ENTRYPOINT of the Dockerfile's own, the base image's applies (and without a CMD too,
    its CMD): the runscript Apptainer derived from the base image's configuration (BASE_RUNSCRIPT,
    saved in %post) is run, given this CMD or the arguments, with SINGULARITY_NO_EVAL=1 so that
    it passes them on as they are, never through the shell (on any runtime that writes such a
    runscript: Apptainer >= 1.1, SingularityCE >= 3.10)."""
    entry, cmd = stage.entrypoint, stage.cmd
    if entry and stage.entrypoint_shell:
        return [f"exec {_quote(stage.shell + [entry[0]])}"]
    if entry:
        default = "" if not cmd else " " + _quote(stage.shell + [cmd[0]] if stage.cmd_shell else cmd)
        return [f'if [ "$#" -gt 0 ]; then exec {_quote(entry)} "$@"; fi', f"exec {_quote(entry)}{default}"]
    base = f"SINGULARITY_NO_EVAL=1 exec {BASE_RUNSCRIPT}"
    default = "" if not cmd else " " + _quote(stage.shell + [cmd[0]] if stage.cmd_shell else cmd)
    return [f'if [ "$#" -gt 0 ]; then {base} "$@"; fi', f"{base}{default}"]


def _render(stages: List[Stage], final: Stage) -> str:
    out: List[str] = []
    for stage in stages:
        out.append(f"Bootstrap: {stage.bootstrap}\nFrom: {stage.base}\nStage: {_stage_label(stage.name)}\n")
        if stage.files:
            out.append("%files")
            out += [f"    {host} {staging}" for host, staging in stage.files]
            out.append("")
        for source_stage in sorted({s for s, _, _ in stage.from_stages}):
            out.append(f"%files from {_stage_label(source_stage)}")
            out += [f"    {path} {staging}" for s, path, staging in stage.from_stages if s == source_stage]
            out.append("")
        if stage.name.startswith(IMAGE_STAGE):
            continue  # only copied from; the image may have no shell to run a %post
        runscript = _runscript(stage) if stage is final else []
        out.append("%post")
        if BASE_RUNSCRIPT in "".join(runscript):
            # (a base without one: Docker's semantics of no ENTRYPOINT, run the arguments)
            out.append(f"    cp /.singularity.d/runscript {BASE_RUNSCRIPT} 2>/dev/null || "
                       f"printf '#!/bin/sh\\nexec \"$@\"\\n' > {BASE_RUNSCRIPT}; chmod 0755 {BASE_RUNSCRIPT}")
        out.append(f"    mkdir -p {STAGING}")
        out += [_body_line(line) for line in stage.post]
        out.append(f"    rm -rf {STAGING}")
        out.append("")
        if stage is final:
            if stage.environment:
                out.append("%environment")
                out += [_body_line(line) for line in stage.environment]
                out.append("")
            if stage.labels:
                out.append("%labels")
                out += [f"    {k} {v}" for k, v in stage.labels.items()]
                out.append("")
            out.append("%runscript")
            out.append(f"    cd {sh_quote(stage.workdir)} 2>/dev/null || true")
            out += [_body_line(line) for line in runscript]
            out.append("")
    return "\n".join(out)


def _stage_label(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name if not name.isdigit() else f"stage{name}")

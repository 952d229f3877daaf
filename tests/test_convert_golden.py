"""`compose2sif convert` output, file by file, against golden files; and the generated run.sh
passes `bash -n` and shellcheck. Regenerate the golden files after an intended change with
    UPDATE_GOLDEN=1 python3 -m pytest tests/test_convert_golden.py
"""
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compose2sif import render
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan.mirrors import Mirrors
from helpers import assert_valid_bash

HERE = Path(__file__).resolve().parent
CASES = {"e2e-stack": HERE / "e2e" / "stack", "llm-chat": HERE.parent / "stacks" / "llm-chat"}
GOLDEN = HERE / "golden"
REPO = HERE.parent
ENGINE_MARKER = "# ---- the engine (the same for every project: run/lib, run/cmd, run/main.sh)"


def joined_engine() -> str:
    """run/lib/*.sh, run/cmd/*.sh (each in name order), then run/main.sh, a blank line between two:
    the order run/README.md gives, read here independently of render.engine_files."""
    run = REPO / "run"
    files = [*sorted((run / "lib").glob("*.sh")), *sorted((run / "cmd").glob("*.sh")), run / "main.sh"]
    return "\n".join(f.read_text() for f in files)


def convert(source: Path, tmp_path: Path) -> Path:
    project_dir = tmp_path / "project"
    shutil.copytree(source, project_dir, ignore=shutil.ignore_patterns("*.gguf"))
    project = load_project(ProjectOptions(cwd=str(project_dir), environ={"HOME": "/home/user"}))
    options = PlanOptions(registry_mirrors=Mirrors.parse(["127.0.0.1:5000"]), port_base=30000, address_block="127.45.3",
                          loopback=True)  # as convert plans it with the package's helpers: as written, and the fallback
    out = tmp_path / "out"
    render.write(build_plan(project, options), str(out))
    return out


def packaged_helper_text(rel: str, path: Path) -> str:
    """What stands for a helper of bin/ in the golden files: each must be the package's own file,
    whose bytes change with the helpers' sources and toolchain; bin/helpers.json by what it lists."""
    from compose2sif import helpers
    if rel == helpers.OUTPUT_MANIFEST:
        listing = json.loads(path.read_text())
        return "".join(f"{h['arch']} {h['name']}\n" for h in listing["helpers"])
    source = Path(helpers.FALLBACK_FORWARDER) if rel == helpers.OUTPUT_FALLBACK else \
        Path(helpers.PACKAGED) / Path(rel).relative_to("bin")
    assert path.read_bytes() == source.read_bytes(), f"{rel} is not the package's {source}"
    return f"<{source.name} of the package>\n"


def normalised(out: Path, tmp_path: Path):
    files = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if rel.startswith("bin/") and path.is_file():  # the package's helpers, compared with the package's own
            files[rel] = packaged_helper_text(rel, path)
            continue
        if path.is_file():
            text = path.read_text().replace(str(tmp_path / "project"), "<PROJECT>")
            if rel == "run.sh":  # the engine part is run/'s files joined verbatim; compare the generated part
                end = text.index("\n", text.index(ENGINE_MARKER)) + 1
                assert text[end:] == joined_engine()
                text = text[:end]
            # a definition's digest covers the absolute paths in it, which differ from run to run
            files[rel] = re.sub(r'"digest": "[0-9a-f]{64}"', '"digest": "<sha256>"', text)
    return files


@pytest.mark.parametrize("case", sorted(CASES))
def test_convert_output_matches_golden_files(case, tmp_path):
    files = normalised(convert(CASES[case], tmp_path), tmp_path)
    golden = GOLDEN / case
    if os.environ.get("UPDATE_GOLDEN"):
        shutil.rmtree(golden, ignore_errors=True)
        for rel, text in files.items():
            (golden / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden / rel).write_text(text)
    expected = {p.relative_to(golden).as_posix(): p.read_text() for p in sorted(golden.rglob("*")) if p.is_file()}
    assert sorted(files) == sorted(expected)
    for rel in files:
        assert files[rel] == expected[rel], f"{rel} differs from tests/golden/{case}/{rel}"


def test_output_is_private(tmp_path):
    out = convert(CASES["e2e-stack"], tmp_path)
    assert out.stat().st_mode & 0o777 == 0o700
    for env_file in (out / "env").iterdir():
        assert env_file.stat().st_mode & 0o777 == 0o600
    assert "change-me-too" not in (out / "run.sh").read_text()  # secrets stay in the env files
    assert "change-me-too" not in (out / "plan.json").read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_sh_is_valid_bash_and_shellcheck_clean(case, tmp_path):
    assert_valid_bash(convert(CASES[case], tmp_path) / "run.sh")


def test_run_sh_rejects_bad_commands_without_touching_anything(tmp_path):
    script = convert(CASES["e2e-stack"], tmp_path) / "run.sh"
    for args, message in ((["up", "nosuch"], "no such service: nosuch"), (["frob"], "unknown command frob"),
                          (["exec", "api"], "usage: exec [--index N] SERVICE COMMAND")):
        proc = subprocess.run([str(script), *args], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
        assert proc.returncode == 1 and message in proc.stderr, (args, proc.stderr)
    assert not (script.parent / "state").exists()
    proc = subprocess.run([str(script), "ps"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "C2S_RUNTIME": "/nonexistent/apptainer"})
    assert proc.returncode == 1 and "/nonexistent/apptainer --version failed" in proc.stderr

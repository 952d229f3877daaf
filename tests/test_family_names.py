"""Generic code never names an image family: what compose2sif knows of one lives in its module in
compose2sif/adapters/, behind the hooks of adapters/base.py. This fails when a family's name, or
the name of one of its images, appears in the code of the planner, the renderer, the command line,
the convert stage, the batch job or the runner: in a name, a string or a docstring. Comments are
prose and may say which program a workaround was for."""
import io
import re
import tokenize
from pathlib import Path

from compose2sif import adapters

REPO = Path(__file__).resolve().parent.parent
GENERIC = ["compose2sif/plan/**/*.py", "compose2sif/render.py", "compose2sif/cli.py", "compose2sif/convert.py",
           "compose2sif/batch.py", "run/**/*.py", "run/**/*.sh"]
# the images the adapters match by other names than their family's (each checked against an adapter below)
IMAGE_NAMES = ["mariadb", "percona", "pgvector", "postgis", "valkey", "openresty", "busybox", "langgenius"]


def family_words():
    words = {p.stem for p in (REPO / "compose2sif" / "adapters").glob("*.py") if p.stem not in ("__init__", "base")}
    words |= {re.split(r"[-.]", adapter.family)[0] for adapter in adapters.ADAPTERS}
    return sorted(words | set(adapters.PRESETS) | set(IMAGE_NAMES))


# a family's name where a word starts (`REDISCLI_AUTH`, `Nginx`, `mysqladmin`; not `modify`)
NAMED = re.compile(r"(?<![A-Za-z])(" + "|".join(map(re.escape, family_words())) + ")", re.IGNORECASE)


def code_of(text: str, suffix: str) -> str:
    """The text less its comments."""
    if suffix == ".py":
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        return "\n".join(t.string for t in tokens if t.type != tokenize.COMMENT)
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return "\n".join(re.sub(r"\s#.*$", "", line) for line in lines)


def offenders(text: str, suffix: str):
    return sorted({m.group(1).lower() for m in NAMED.finditer(code_of(text, suffix))})


def generic_files():
    found = sorted({p for pattern in GENERIC for p in REPO.glob(pattern) if p.is_file()})
    assert len(found) > 10, found
    return found


def test_generic_code_names_no_image_family():
    named = {}
    for path in generic_files():
        words = offenders(path.read_text(encoding="utf-8"), path.suffix)
        if words:
            named[str(path.relative_to(REPO))] = words
    assert not named, f"generic code names image families (move that knowledge into an adapter's hook): {named}"


def test_the_list_covers_every_adapter_and_only_their_images():
    words = family_words()
    for adapter in adapters.ADAPTERS:
        assert NAMED.search(adapter.family), adapter.family
    for name in IMAGE_NAMES:
        assert any(name in adapter.images for adapter in adapters.ADAPTERS) or \
            any(name in preset.image_prefix for preset in adapters.PRESETS.values()), name
    assert {"nginx", "redis", "mysql", "postgres", "vllm", "llama", "dify", "squid", "weaviate", "mongo"} <= set(words)


def test_a_planted_name_is_found_in_code_strings_and_docstrings_but_not_comments():
    assert offenders('x = "--tls: no nginx service"\n', ".py") == ["nginx"]
    assert offenders('def f():\n    """Like Dify\'s setup."""\n', ".py") == ["dify"]
    assert offenders("env = {'REDISCLI_AUTH': 1}\n", ".py") == ["redis"]
    assert offenders("if tp: vllm_ranks = 2\n", ".py") == ["vllm"]
    assert offenders("# nginx's listen [::]:P\nx = 1  # mysql\n", ".py") == []
    assert offenders("modify = 'nginxless'\n", ".py") == ["nginx"]
    assert offenders('run_it mysqladmin "$x"  # mongo\n# squid\n', ".sh") == ["mysql"]


def test_adapters_import_nothing_of_the_planner():
    """The arrows run one way: plan imports adapters, adapters import compose2sif.types and model."""
    import subprocess
    import sys
    code = ("import sys, compose2sif.adapters; "
            "print(sorted(m for m in sys.modules if m.startswith(('compose2sif.plan', 'compose2sif.render'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr

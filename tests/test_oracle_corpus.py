"""`compose2sif config --format json` equals Docker Compose's own `config` on every corpus project,
for the keys compose2sif supports; projects Compose rejects, compose2sif rejects too."""
from pathlib import Path

import pytest

from oracle import differences, oracle_mark, prepare_case, run_oracle, run_ours

CORPUS = sorted((Path(__file__).parent / "corpus").iterdir())
INVALID = sorted((Path(__file__).parent / "corpus-invalid").iterdir())

pytestmark = oracle_mark()


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 25
    assert len(INVALID) >= 15


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_matches_docker_compose(case, tmp_path):
    cwd, args, env, spec = prepare_case(case, tmp_path)
    rc, theirs, err = run_oracle(args, cwd, env)
    assert rc == 0, f"the oracle rejected a corpus project: {err}"
    rc, ours, err = run_ours(args, cwd, env)
    assert rc == 0, f"compose2sif rejected what Docker Compose accepts: {err}"
    problems = differences(ours, theirs)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", INVALID, ids=[c.name for c in INVALID])
def test_rejects_what_docker_compose_rejects(case, tmp_path):
    cwd, args, env, _ = prepare_case(case, tmp_path)
    rc, _, oracle_err = run_oracle(args, cwd, env)
    assert rc != 0, "the oracle accepts this project; it does not belong in corpus-invalid"
    rc, _, err = run_ours(args, cwd, env)
    assert rc != 0, f"compose2sif accepted a project Docker Compose rejects ({oracle_err.strip()})"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert "Traceback" not in err and "internal error" not in err
    assert lines[0].startswith("compose2sif: error: ")
    assert str(cwd) in lines[0] or "no configuration file" in lines[0], f"the error does not name the file: {err}"

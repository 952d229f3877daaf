"""Every service key of the Compose Specification is classified, the docs are rendered from the
table, and an unsupported key is never dropped silently."""
import json
import re
from pathlib import Path


from compose2sif.support import EMULATED, HANDLED, SERVICE_KEYS, UNSUPPORTED, render_markdown
from oracle import oracle_mark, base_env, binary, run_ours

REPO = Path(__file__).resolve().parent.parent


def compose_spec_schema():
    """The Compose Specification schema that Docker Compose itself embeds (the oracle binary)."""
    data = Path(binary()).read_bytes()
    for match in re.finditer(rb'"\$schema"', data):
        start = data.rfind(b"{", 0, match.start())
        try:
            schema, _ = json.JSONDecoder().raw_decode(data[start:start + 500_000].decode("latin-1"))
        except ValueError:
            continue
        if "service" in schema.get("definitions", {}):
            return schema
    raise AssertionError("no Compose Specification schema found in the docker-compose binary")


@oracle_mark()
def test_every_schema_service_key_is_classified():
    keys = set(compose_spec_schema()["definitions"]["service"]["properties"])
    assert len(keys) > 80
    missing = sorted(keys - set(SERVICE_KEYS))
    assert not missing, f"Compose service keys with no support classification: {missing}"
    # pre_start is newer than the oracle (compose-go v2.13; the loader's vendored schema adds it)
    stale = sorted(set(SERVICE_KEYS) - keys - {"pre_start"})
    assert not stale, f"classified keys the Compose Specification does not have: {stale}"


def test_each_entry_says_what_happens():
    for key, entry in SERVICE_KEYS.items():
        assert entry.status in (HANDLED, EMULATED, UNSUPPORTED), key
        assert len(entry.note) > 15, f"{key}: the note must say what compose2sif does"


def test_docs_are_rendered_from_the_table():
    assert (REPO / "docs" / "support.md").read_text() == render_markdown(), \
        "docs/support.md is stale: run `python -m compose2sif.support > docs/support.md`"


def test_unsupported_keys_warn_once_naming_service_and_key(tmp_path):
    (tmp_path / "compose.yaml").write_text(
        "services:\n  app:\n    image: a\n    privileged: true\n    cap_add: [NET_ADMIN]\n"
        "    sysctls: {net.core.somaxconn: 1024}\n    mem_limit: 1g\n  quiet:\n    image: b\n")
    rc, _, err = run_ours([], tmp_path, base_env({}))
    assert rc == 0
    warnings = [line for line in err.splitlines() if line.startswith("WARN")]
    for key in ("privileged", "cap_add", "sysctls", "mem_limit"):
        hits = [w for w in warnings if f"`{key}`" in w]
        assert len(hits) == 1 and "'app'" in hits[0], (key, warnings)
    assert not any("'quiet'" in w for w in warnings)
    assert len(warnings) == 4

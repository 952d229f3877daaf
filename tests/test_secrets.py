"""secrets: and configs: in every form, bound read-only where Compose puts them; values from the
environment or inline are written 0600 into the output directory and never reach argv or plan.json."""
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "s3cr3t-from-the-environment"

COMPOSE = """
    services:
      app:
        image: alpine
        secrets:
          - db_password
          - source: api_key
            target: api.key
          - source: token
            target: /etc/app/token
            mode: 0400
        configs:
          - app_conf
          - source: inline
            target: /etc/app/inline.conf
          - source: from_env
            target: relative.conf
    secrets:
      db_password: {file: ./db_password.txt}
      api_key: {environment: API_KEY}
      token: {environment: TOKEN}  # Compose takes `content` for configs only
      unused: {external: true}
    configs:
      app_conf: {file: ./app.conf}
      inline: {content: "port=${PORT:-80}\\n"}
      from_env: {environment: API_KEY}
"""


def load(tmp_path, compose=COMPOSE, environ=None):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    (tmp_path / "db_password.txt").write_text("pw\n")
    (tmp_path / "app.conf").write_text("a=1\n")
    return load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/h", "API_KEY": SECRET,
                                                                   "TOKEN": "t0ken", **(environ or {})}))


def test_every_form_is_bound_read_only_where_compose_puts_it(tmp_path):
    plan = build_plan(load(tmp_path), PlanOptions(port_base=30000))
    binds = {b.target: b for b in plan.service("app").binds if b.read_only}
    assert binds["/run/secrets/db_password"].source == str(tmp_path / "db_password.txt")
    assert binds["/run/secrets/api.key"].source == "config/secrets/api_key"
    assert binds["/etc/app/token"].source == "config/secrets/token"
    assert binds["/app_conf"].source == str(tmp_path / "app.conf")
    assert binds["/etc/app/inline.conf"].source == "config/configs/inline"
    assert binds["/relative.conf"].source == "config/configs/from_env"
    assert plan.configs["config/secrets/api_key"] == SECRET
    assert plan.configs["config/configs/inline"] == "port=80\n"
    assert plan.configs["config/secrets/token"] == "t0ken"
    assert any("secret 'token': mode is not applied" in w for w in plan.warnings)


def test_env_secret_is_written_private_and_kept_out_of_plan_json_and_argv(tmp_path):
    load(tmp_path)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "compose2sif", "convert", "--offline", "-o", str(out)],
                            cwd=tmp_path, capture_output=True, text=True,
                            env={"PATH": os.environ["PATH"], "HOME": "/tmp", "PYTHONPATH": REPO, "API_KEY": SECRET,
                                 "TOKEN": "t0ken"})
    assert result.returncode == 0, result.stderr
    secret_file = out / "config" / "secrets" / "api_key"
    assert secret_file.read_text() == SECRET
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    holders = [p for p in out.rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert sorted(p.relative_to(out).as_posix() for p in holders) == ["config/configs/from_env",
                                                                      "config/secrets/api_key"]
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in holders)
    plan = json.loads((out / "plan.json").read_text())
    assert "config/secrets/api_key" in plan["configs"]


@pytest.mark.parametrize("compose,path,message", [
    ("services: {app: {image: alpine, secrets: [ext]}}\nsecrets: {ext: {external: true}}",
     "secrets.ext", "is external"),
    ("services: {app: {image: alpine, secrets: [e]}}\nsecrets: {e: {environment: NOT_SET_ANYWHERE}}",
     "secrets.e.environment", "NOT_SET_ANYWHERE is not set"),
    ("services: {app: {image: alpine, configs: [c]}}\nconfigs: {c: {file: ./missing.conf}}",
     "configs.c.file", "is not a file"),
    ("services: {app: {image: alpine, configs: [{source: c, target: '/a:b'}]}}\nconfigs: {c: {content: x}}",
     "services.app.configs", "cannot be bound"),
])
def test_what_cannot_be_had_is_one_error(tmp_path, compose, path, message):
    project = load(tmp_path, compose)
    with pytest.raises(ComposeError) as info:
        build_plan(project, PlanOptions(port_base=30000))
    assert info.value.path == path and message in info.value.message


def test_odd_names_get_distinct_files(tmp_path):
    # Compose allows [a-zA-Z0-9._-] in names (the loader refuses the rest); a leading dot is replaced
    project = load(tmp_path, """
        services: {app: {image: alpine, secrets: [.a, a]}}
        secrets: {.a: {environment: API_KEY}, a: {environment: TOKEN}}
    """)
    plan = build_plan(project, PlanOptions(port_base=30000))
    sources = {b.target: b.source for b in plan.service("app").binds if b.read_only}
    assert sources["/run/secrets/a"] == "config/secrets/a"
    assert sources["/run/secrets/.a"].startswith("config/secrets/a-") and sources["/run/secrets/.a"] != "config/secrets/a"

# Generated secrets in place of public defaults (plan/generated.py): their shape, placeholders,
# and what is kept from an earlier convert. Dify's own readers' checks are in test_dify.py.

from compose2sif import secret_rules as rules  # noqa: E402
from compose2sif.plan import generated  # noqa: E402


@pytest.mark.parametrize("default,prefix,classes,length", [
    ("sk-9f73s3ljTXVcMT3Blb3ljTqtsKiGHXVcMT3BlbkFJLK7U", "sk-", "aA0", 45),
    ("difyai123456", "", "a0", 32),                     # too short to be a model for length: 32
    ("dify-sandbox", "", "a", 32),                      # `-` is punctuation: letters only
    ("lYkiYYT6owG+71oLerGzA7GXCgOT++6ovaezWAjpCjf+Sjc3ZtU+qUEi", "", "aA0", 56),   # no + or /
    ("", "", "aA0", 32),
])
def test_a_generated_value_has_the_shape_of_its_default(default, prefix, classes, length):
    value = rules.rule_of(default).generate()
    assert value.startswith(prefix) and len(value) == len(prefix) + length
    body = value[len(prefix):]
    for cls, chars in (("a", "abcdefghijklmnopqrstuvwxyz"), ("A", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"), ("0", "0123456789")):
        if cls not in classes:
            assert not set(body) & set(chars), value
    assert rules.url_safe(value)


def test_a_base64url_rule_generates_what_it_checks():
    rule = rules.Rule(length=32, decoded=True, check=rules.base64url_bytes(32))
    value = rule.generate()
    assert len(value) == 43 and "=" not in value and rule.check(value)
    assert not rule.check("ab" * 24)                       # 48 hex characters decode to 36 bytes
    assert not rule.check("replace-with-base64url-32-byte-secret")
    assert not rule.check(value + "=")                     # padded: not the strict form


@pytest.mark.parametrize("text,placeholder", [
    ("replace-with-base64url-32-byte-secret", True), ("your-secret-key-here", True), ("changeme", True),
    ("CHANGE_ME", True), ("difyai123456", False), ("replacement", False), ("s3cr3t", False)])
def test_placeholders_mean_must_be_set(text, placeholder):
    assert (rules.PLACEHOLDER.fullmatch(text) is not None) == placeholder


def test_choose_generates_for_defaults_and_placeholders_and_keeps_what_passes():
    strict = rules.Rule(length=32, decoded=True, check=rules.base64url_bytes(32), reader="server",
                            why="32 bytes")
    table = {"KEY": rules.PublicDefault("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY", strict),
             "DB": rules.PublicDefault("difyai123456", rules.rule_of("difyai123456", keep_stored=True)),
             "OWN": rules.PublicDefault("public", rules.rule_of("public", empty_is_own=True)),
             "MINE": "default"}
    chosen = generated.choose(table, {"KEY": "replace-with-a-key", "DB": "difyai123456", "OWN": "",
                                      "MINE": "the user's"}, {"KEY": "ab" * 24, "DB": "not:url/safe"})
    assert sorted(chosen) == ["DB", "KEY"] and strict.check(chosen["KEY"]) and chosen["DB"] == "not:url/safe"
    assert chosen.placeholders == {"replace-with-a-key": "KEY"}
    # the stored key fails (one line), the placeholder (one line), the user's own value its reader refuses
    assert [n.split(" ")[0] for n in chosen.notes] == ["KEY:", "KEY", "MINE"]
    assert "replace-with-a-key" not in " ".join(chosen.notes)
    replace = generated.Replacer(table, chosen)
    assert replace("KEY=replace-with-a-key") == f"KEY={chosen['KEY']}"
    assert replace.notes == chosen.notes

"""Every refusal names one fix, and the fix works: this test reads the fix off the refusal line,
adds it to the project as a user would (a compose file loaded after the project's own, and the
file it names), plans again, and repeats until the plan is clean, then checks the plan is sound.

A fix is one of:
- `fix: add to service 'S' `x-compose2sif: {...}``: the hint, added as given. Where the planner
  cannot know the program's setting it says `VAR`, "the variable it reads its port from"; the test
  names one (the user would read the image's documentation) and records that it had to.
- `fix: bind its config into service 'S' (... `listen P;`): add to its volumes `./F:TARGET:ro``:
  the file, holding the `listen` line the refusal names, bound where it says.

The table at the end is the state of ../shared/realworld: each project plans clean, or is
refused and planned clean after the fixes it names."""
import re
import textwrap

import pytest
import yaml

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan
from helpers import check_plan
from test_realworld_network import PROJECTS, _load

OPTIONS = dict(port_base=30000, address_block="127.45.3", uid=1000)
FIX = re.compile(r"; fix: (.*)$")
FIX_HINT = re.compile(r"add to service '([^']+)' `x-compose2sif: (\{.*?\})`(?=; |, VAR being|$)")
FIX_BIND = re.compile(r"bind its config into service '([^']+)' \(.*?`listen (\d+);`\): add to its volumes "
                      r"`\./([\w.-]+):(/[^`:]+):ro`")
OVERRIDE = "zz-compose2sif-fixes.yaml"


class Fixes:
    """The fixes applied so far, as the files a user would add."""

    def __init__(self):
        self.services = {}
        self.files = {}
        self.named = []     # (service, port): the test named the variable for the hint's VAR

    def apply(self, message: str) -> list:
        """Add every fix the refusal names; returns their kinds. Fails when it names none."""
        assert "\n" not in message
        fix = FIX.search(message)
        assert fix, f"the refusal names no fix: {message}"
        kinds = []
        for hint in FIX_HINT.finditer(fix.group(1)):
            service, mapping = hint.group(1), yaml.safe_load(hint.group(2))
            assert isinstance(mapping, dict), hint.group(2)
            named = False
            for port, knob in (mapping.get("ports") or {}).items():
                if knob.get("env") == "VAR":
                    knob["env"] = f"C2S_PORT_{port}"  # the user names the variable the program reads
                    self.named.append((service, int(port)))
                    named = True
            merged = self.services.setdefault(service, {}).setdefault("x-compose2sif", {})
            for key, value in mapping.items():
                merged[key] = {**merged.get(key, {}), **value} if isinstance(value, dict) else value
            kinds.append("named" if named else "hint")
        for bind in FIX_BIND.finditer(fix.group(1)):
            service, port, name, target = bind.groups()
            self.files[name] = f"server {{\n    listen {port};\n    location / {{ root /usr/share/nginx/html; }}\n}}\n"
            self.services.setdefault(service, {}).setdefault("volumes", []).append(f"./{name}:{target}:ro")
            kinds.append("bind")
        assert kinds, f"the refusal names no fix that can be applied: {message}"
        return kinds

    def added(self) -> dict:
        return {**self.files, OVERRIDE: yaml.safe_dump({"services": self.services})} if self.services else {}


def plan_after_fixes(load, rounds: int = 12):
    """(plan, the kinds of fix each refusal named, Fixes): plan; on a refusal apply its fixes and
    plan again."""
    fixes, kinds = Fixes(), []
    for _ in range(rounds):
        try:
            plan = build_plan(load(fixes.added()), PlanOptions(**OPTIONS))
        except ComposeError as exc:
            kinds.append(fixes.apply(str(exc)))
            continue
        check_plan(plan)
        return plan, kinds, fixes
    pytest.fail(f"still refused after {rounds} fixes: {kinds}")


def local(tmp_path, compose: str, files=None):
    def load(added):
        (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
        for name, text in {**(files or {}), **added}.items():
            (tmp_path / name).write_text(textwrap.dedent(text))
        names = ["compose.yaml"] + sorted(n for n in added if n.endswith(".yaml"))
        return load_project(ProjectOptions(cwd=str(tmp_path), files=[str(tmp_path / n) for n in names],
                                           environ={"HOME": "/home/u"}))
    return load


# ---- the refusals the planner makes, each fixed as it says --------------------------------------

def test_a_privileged_port_of_an_unknown_program_moves_through_the_variable_the_fix_names(tmp_path):
    plan, kinds, fixes = plan_after_fixes(local(tmp_path, """
        services:
          web: {image: example/web, ports: ["8080:80"]}
    """))
    assert kinds == [["named"]] and fixes.named == [("web", 80)]
    web = plan.service("web")
    assert web.environment["C2S_PORT_80"] == str(next(p.host for p in web.ports if p.container == 80))


def test_two_unknown_programs_on_one_port_are_parted_by_moving_one(tmp_path):
    plan, kinds, _ = plan_after_fixes(local(tmp_path, """
        services:
          a: {image: example/a, healthcheck: {test: "curl -f localhost:9000"}}
          b: {image: example/b, healthcheck: {test: "wget -q localhost:9000"}}
          c: {image: example/c, healthcheck: {test: "wget -q localhost:9000"}}
    """))
    assert kinds == [["named", "named"]]  # b and c, in one refusal
    hosts = sorted(p.host for s in plan.services for p in s.ports)
    assert hosts[0] == 9000 and len(set(hosts)) == 3


def test_nginx_without_its_config_is_fixed_by_binding_one(tmp_path):
    """nginx reads no port variable: the fix binds a config, which compose2sif then renders."""
    plan, kinds, fixes = plan_after_fixes(local(tmp_path, """
        services:
          web: {image: nginx:1.27, ports: ["8080:80"]}
    """))
    assert kinds == [["bind"]] and list(fixes.files) == ["web-default.conf"]
    rendered = [text for path, text in plan.configs.items() if path.endswith("/etc/nginx/conf.d/default.conf")]
    endpoint = next(p for p in plan.service("web").ports if p.container == 80)
    assert rendered and f"listen {endpoint.address}:{endpoint.host};" in rendered[0]


def test_a_hint_for_a_variable_that_holds_host_and_port_keeps_that_shape(tmp_path):
    plan, kinds, _ = plan_after_fixes(local(tmp_path, """
        services:
          web:
            image: example/web
            ports: ["8080:80"]
            environment: {LISTEN: "0.0.0.0:80", PORT_ONLY: ":80"}
            x-compose2sif: {ports: {"80": {env: LISTEN}}}
          api:
            image: example/api
            ports: ["8081:81"]
            environment: {PORT_ONLY: ":81"}
            x-compose2sif: {ports: {"81": {env: PORT_ONLY}}}
    """))
    assert kinds == []
    web, api = plan.service("web"), plan.service("api")
    assert web.environment["LISTEN"] == f"0.0.0.0:{web.ports[0].host}"
    assert api.environment["PORT_ONLY"] == f":{api.ports[0].host}"


def test_a_flag_hint_goes_before_positional_arguments_and_takes_host_and_port(tmp_path):
    """`store serve --console :9090 /data`: a flag after `/data` is no flag to such a program."""
    plan, _, _ = plan_after_fixes(local(tmp_path, """
        services:
          store:
            image: example/store
            command: ["serve", "--console", ":9090", "/data"]
            ports: ["9000:80"]
            x-compose2sif: {ports: {"80": {flag: --listen-on, template: "{address}:{port}"}}}
    """))
    store = plan.service("store")
    endpoint = next(p for p in store.ports if p.container == 80)
    assert store.launch[1:] == ["serve", "--console", ":9090", "--listen-on",
                                f"{endpoint.address}:{endpoint.host}", "/data"]


# ---- ../shared/realworld: the table -------------------------------------------------------------

# project -> "clean", or per refusal the kinds of fix it named ("hint": an x-compose2sif hint as
# given; "named": a hint whose VAR the user names, one per service; "bind": a config bound).
# Each refused project is refused once: its refusal names every port that cannot move.
NAMED = [["named"]]
TABLE = {
    "airflow": "clean", "anythingllm": "clean", "bisheng": "clean", "cognita": "clean", "coze-studio": "clean",
    "directus": "clean", "prefect": "clean", "weblate": "clean",
    "fastgpt": [["named"] * 4],  # five servers on 3000 (Node's default): four must be told another port
    "flowise": "clean", "immich": "clean",
    "khoj": NAMED,               # search and sandbox both on 8080
    "langfuse": "clean", "librechat": "clean", "lobechat": "clean", "mattermost": "clean", "mem0": "clean",
    "milvus-cluster": "clean", "n8n-ai-starter": "clean", "nextcloud-fpm": "clean",
    "onyx": NAMED,               # two model servers of one image on 9000
    "open-webui": "clean", "opik": "clean", "paperless-ngx": "clean", "penpot": "clean", "plane": "clean",
    "plausible": "clean", "qanything": "clean",
    "r2r": NAMED,                # hatchet-dashboard on 80
    "ragflow": NAMED,            # 80 and 443 of the web front inside the ragflow image
    "sentry-self-hosted": "clean", "supabase": "clean", "superagi": "clean",
    "surfsense": NAMED,          # searxng and opensandbox-server both on 8080
    "taskingai": [["named"] * 4],  # frontend on 80, three backends of one image on 8000 beside backend-api
    "temporal": "clean",
    "windmill": NAMED,           # caddy on 25 and 80
    "zep-ce": "clean",
    "zulip": NAMED,              # 25, 80 and 443
}


def test_the_table_has_every_realworld_project():
    assert sorted(TABLE) == sorted(PROJECTS)


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_realworld_project_plans_clean_or_after_the_fixes_its_refusals_name(name, tmp_path):
    _, kinds, _ = plan_after_fixes(lambda added: _load(name, tmp_path, added=added))
    assert (kinds or "clean") == TABLE[name]

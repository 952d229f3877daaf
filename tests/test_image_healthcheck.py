"""An image's HEALTHCHECK applies where compose gives none, and fills in what compose leaves unset,
field by field, as Docker merges them: from the registry config of a pulled image, from the
Dockerfile of a built one (inherited across its stages). weblate/weblate has no healthcheck in its
compose files and relies on its image's (a 5 min start period for its migrations)."""
import textwrap

import pytest

from compose2sif.errors import ComposeError
from compose2sif.load import ProjectOptions, load_project
from compose2sif.model import Healthcheck, healthcheck_of
from compose2sif.plan import PlanOptions, build_plan
from compose2sif.plan import dockerfile
from compose2sif.registry import ImageConfig, config_healthcheck
from compose2sif.render import render_runner

SECOND = 1_000_000_000
WEBLATE_CONFIG = {"Healthcheck": {"Test": ["CMD", "/app/bin/health_check"], "Interval": 30 * SECOND,
                                  "Timeout": 3 * SECOND, "StartPeriod": 300 * SECOND}}


def plan_for(tmp_path, compose, files=None, **kw):
    (tmp_path / "compose.yaml").write_text(textwrap.dedent(compose))
    for name, content in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(content))
    project = load_project(ProjectOptions(cwd=str(tmp_path), environ={"HOME": "/home/u"}))
    return build_plan(project, PlanOptions(port_base=30000, **kw))


def convert(tmp_path, text):
    return dockerfile.convert(text, str(tmp_path), {}, None, "Dockerfile")


def health(plan, name):
    return plan.service(name).healthcheck


def test_registry_config_healthcheck_is_read_in_seconds_with_docker_defaults_for_the_rest():
    got = config_healthcheck(WEBLATE_CONFIG)
    assert got.test == ("CMD", "/app/bin/health_check")
    assert (got.interval, got.timeout, got.start_period, got.retries, got.start_interval) == (30, 3, 300, 3, 5)
    assert got.given == {"test", "interval", "timeout", "start_period"}
    assert config_healthcheck({}) is None and config_healthcheck({"Healthcheck": {"Test": []}}) is None
    assert config_healthcheck({"Healthcheck": {"Test": ["NONE"]}}).disabled


@pytest.mark.parametrize("line, test, seconds, retries", [
    ("HEALTHCHECK CMD curl -f http://localhost/ || exit 1", ("CMD-SHELL", "curl -f http://localhost/ || exit 1"), {}, 3),
    ('HEALTHCHECK --interval=5s --timeout=2s --start-period=1m --start-interval=1s --retries=7 CMD ["/bin/check", "-q"]',
     ("CMD", "/bin/check", "-q"), {"interval": 5, "timeout": 2, "start_period": 60, "start_interval": 1}, 7),
    ("HEALTHCHECK NONE", ("NONE",), {}, 3),
])
def test_dockerfile_healthcheck_is_parsed_as_docker_stores_it(tmp_path, line, test, seconds, retries):
    got = convert(tmp_path, f"FROM debian:12 AS base\n{line}\nFROM base\nCMD [\"app\"]\n").healthcheck
    assert got.test == test and got.retries == retries  # (the second stage inherits it)
    for field_name, value in seconds.items():
        assert getattr(got, field_name) == value


@pytest.mark.parametrize("line", ["HEALTHCHECK --interval=often CMD true", "HEALTHCHECK --user=x CMD true",
                                  "HEALTHCHECK curl -f http://localhost/", "HEALTHCHECK CMD"])
def test_a_bad_dockerfile_healthcheck_is_one_line_naming_the_dockerfile_and_line(tmp_path, line):
    with pytest.raises(ComposeError) as error:
        convert(tmp_path, f"FROM debian:12\n{line}\n")
    assert "Dockerfile: line 2: HEALTHCHECK" in str(error.value) and "\n" not in str(error.value)


def test_the_image_healthcheck_applies_where_compose_has_none_and_up_waits_for_it(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          weblate: {image: "example/weblate:1"}
          other: {image: "example/plain:1"}
    """, image_configs={"example/weblate:1": ImageConfig(healthcheck=config_healthcheck(WEBLATE_CONFIG)),
                        "example/plain:1": ImageConfig()})
    got = health(plan, "weblate")
    assert got["test"] == ["CMD", "/app/bin/health_check"]
    assert (got["interval"], got["timeout"], got["start_period"], got["retries"]) == (30, 3, 300, 3)
    assert got["from"] == "image config of example/weblate:1"
    assert health(plan, "other") is None
    runner = render_runner(plan)
    function = runner.split("    S_NAME=weblate\n", 1)[1].split("\n}", 1)[0]
    assert "S_HEALTH=(CMD /app/bin/health_check)" in function and "S_HEALTH_START_PERIOD=300.0" in function


def test_compose_fields_win_and_what_compose_leaves_unset_comes_from_the_image(tmp_path):
    image = ImageConfig(healthcheck=config_healthcheck(WEBLATE_CONFIG))
    plan = plan_for(tmp_path, """
        services:
          timings: {image: "example/weblate:1", healthcheck: {interval: 10s, retries: 5}}
          own: {image: "example/weblate:1", healthcheck: {test: ["CMD", "true"]}}
          off: {image: "example/weblate:1", healthcheck: {disable: true}}
          none: {image: "example/weblate:1", healthcheck: {test: ["NONE"]}}
    """, image_configs={"example/weblate:1": image})
    timings = health(plan, "timings")
    assert timings["test"] == ["CMD", "/app/bin/health_check"]  # compose gives only timings: the image's test
    assert (timings["interval"], timings["retries"], timings["timeout"], timings["start_period"]) == (10, 5, 3, 300)
    assert timings["from"] == "compose file; test, timeout, start_period from the image config of example/weblate:1"
    own = health(plan, "own")
    assert own["test"] == ["CMD", "true"] and (own["interval"], own["timeout"], own["start_period"]) == (30, 3, 300)
    assert own["from"] == "compose file; interval, timeout, start_period from the image config of example/weblate:1"
    assert health(plan, "off") is None and health(plan, "none") is None


def test_a_built_image_gets_its_dockerfile_healthcheck(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          app: {build: ./app}
          checked: {build: ./app, healthcheck: {test: "exit 0"}}
    """, files={"app/Dockerfile": "FROM debian:12\nHEALTHCHECK --start-period=2m CMD /usr/bin/check\nCMD [\"app\"]\n"})
    app = health(plan, "app")
    assert app["test"] == ["CMD-SHELL", "/usr/bin/check"] and app["start_period"] == 120
    assert app["from"] == "Dockerfile HEALTHCHECK"
    assert health(plan, "checked")["test"] == ["CMD-SHELL", "exit 0"]


def test_without_the_image_config_the_plan_knows_only_the_compose_healthcheck(tmp_path):
    plan = plan_for(tmp_path, """
        services:
          weblate: {image: "example/weblate:1", healthcheck: {interval: 10s}}
    """)
    assert health(plan, "weblate") is None  # timings without a test, and no image test known: nothing to run


def test_healthcheck_equality_ignores_which_fields_were_given():
    assert healthcheck_of(["CMD", "x"], {"interval": 30}, 3) == Healthcheck(test=("CMD", "x"))

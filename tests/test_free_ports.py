"""No unit test publishes or binds a fixed port where it starts something: CI runs the unit suite
beside the end-to-end suite, whose stacks publish fixed ports of their own (test_e2e's second
project publishes 18081, which test_hostile once published too and then found held). A test that
runs `up`, a forwarder or a server gets its ports from helpers.free_ports; a fixed number is fine
only where nothing is started (a plan, a convert, a refusal).

The check reads each unit test module that starts something (names the `up` verb, start_forwarders,
start_service or a server's bind): no module-level value of it, and no function of it that starts
something, holds a published port of a fixed number."""
import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# a compose port with a fixed host side of 1024 or more: "8080:80", '127.0.0.1:18081:8080', - 9000:9000
FIXED = re.compile(r"""ports:[^\n]*?[\s"'\[,-](?:\d{1,3}(?:\.\d{1,3}){3}:)?(?:[1-9]\d{3,4}):\d+""")
STARTS = re.compile(r"""["'\s]up["'\s]|\bup -d\b|start_forwarders|start_service|\.bind\(\(""")


def offenders(path: Path):
    """Where in the module a fixed published port meets a start: a function that starts something
    and holds one; a module-level value that holds one, in a module that starts something anywhere
    (its tables go to whatever runs them)."""
    source = path.read_text()
    tree = ast.parse(source)
    if not STARTS.search(source):
        return
    for node in tree.body:
        if isinstance(node, ast.Assign) and FIXED.search(ast.get_source_segment(source, node.value) or ""):
            yield f"{path.name}::{', '.join(t.id for t in node.targets if isinstance(t, ast.Name))}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = ast.get_source_segment(source, node) or ""
            if STARTS.search(body) and FIXED.search(body):
                yield f"{path.name}::{node.name}"


def test_the_check_sees_a_fixed_published_port_in_a_test_that_starts_something(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text('STACK = "services:\\n  web:\\n    ports: [\\"127.0.0.1:18081:8080\\"]\\n"\n\n'
                      'def test_up(tmp_path):\n    run(STACK, ["up", "-d"])\n\n'
                      'def test_plan_only():\n    plan("ports: [\'8080:80\']")\n\n'
                      'def test_free(tmp_path):\n    run("ports: [\'%d:80\']" % free_ports(1)[0], ["up"])\n'
                      'TABLE = [("values", STACK)]\n\n'
                      'def test_table(tmp_path):\n    for _, stack in TABLE:\n        run(stack, ["up"])\n')
    assert list(offenders(sample)) == ["test_sample.py::STACK"]
    sample.write_text('def test_up(tmp_path):\n    run("ports: [\'18081:80\']", ["up", "-d"])\n\n'
                      'def test_plan_only():\n    plan("ports: [\'8080:80\']")\n')
    assert list(offenders(sample)) == ["test_sample.py::test_up"]


@pytest.mark.parametrize("path", sorted(p for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name),
                         ids=lambda p: p.name)
def test_no_unit_test_that_starts_something_publishes_a_fixed_port(path):
    assert not list(offenders(path)), "give it helpers.free_ports instead"

"""`user:` with root's id or group 0 (Airflow's compose file: `50000:0`, and `0:0` for its init) on
the rootless test bed: such a service gets --fakeroot, root's ids inside mapped to the user, so an
entrypoint that checks for group 0 (apache/airflow's) starts, and one that chowns as root does
(tests/e2e/root-group-stack, STAND-INS of those entrypoints on Debian's Python)."""
import pytest

pytestmark = pytest.mark.e2e

OUT = "out-rootgroup"


@pytest.fixture(scope="module")
def rootgroup(node):
    node.copy_stack("root-group-stack", source="root-group-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    proc = node.c2s(f"-f root-group-stack/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}",
                    timeout=1500)
    yield node, proc
    node.run(f"cd ~ && {OUT}/run.sh down -v", timeout=300)


def test_an_entrypoint_that_checks_for_group_0_starts_and_one_that_chowns_as_root_does(rootgroup):
    node, proc = rootgroup
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "asks for root's" not in proc.stderr, proc.stderr  # (the line said where fakeroot is not given)
    logs = node.run(f"cd ~ && {OUT}/run.sh logs init", timeout=120).stdout
    assert logs.split()[-3:] == ["0", "0", "chowned"], logs
    ps = node.run(f"cd ~ && {OUT}/run.sh ps", timeout=120).stdout
    assert "healthy" in next(line for line in ps.splitlines() if line.split()[:1] == ["app"]), ps
    ids = node.run(f"cd ~ && {OUT}/run.sh exec app sh -c 'id -u; id -g'", timeout=120)
    assert ids.stdout.split() == ["0", "0"], ids.stdout + ids.stderr

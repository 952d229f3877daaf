"""`user:` asking for root's id or group (Airflow's compose: `50000:0`, `0:0`): the plan gives such a
service --fakeroot with id 0 mapped (run.sh probes it, and says the line where the node does not
give it); any other `user:` runs as the caller, as before."""
import pytest

from compose2sif.load import ProjectOptions, load_project
from compose2sif.plan import PlanOptions, build_plan


@pytest.mark.parametrize("user, wanted", [
    ("50000:0", "group"), ("0:0", "user"), ("root", "user"), ("0", "user"), ("airflow:root", "group"),
    ("1000", None), ("1000:1000", None), ("10:100", None),
])
def test_root_or_group_0_gets_fakeroot_with_id_0_mapped(tmp_path, user, wanted):
    (tmp_path / "compose.yaml").write_text(f"services:\n  app:\n    image: busybox\n    user: '{user}'\n"
                                           "  other:\n    image: busybox\n")
    plan = build_plan(load_project(ProjectOptions(cwd=str(tmp_path), environ={})), PlanOptions())
    app, other = plan.service("app"), plan.service("other")
    assert other.fakeroot is None
    if wanted is None:
        assert app.fakeroot is None
        return
    assert app.fakeroot["ids"] == 0
    assert app.fakeroot["without"] == (f"service 'app': `user: {user}` asks for root's {wanted} inside, which needs "
                                       "apptainer --fakeroot, and this node does not give it; it runs as you, and an "
                                       "entrypoint that checks for it may stop")

"""Definition safety on a real Apptainer 1.4.5: a Dockerfile whose lines would open a %setup
section (run on the host by `apptainer build`) builds with every line in the container."""
import pytest

pytestmark = pytest.mark.e2e


def test_hostile_dockerfile_runs_nothing_on_the_host(node):
    node.copy_stack("hostile-build", source="hostile-build")
    node.run("cd ~ && rm -rf hostile-out c2s-pwned-by-*")
    node.c2s(f"-f hostile-build/compose.yaml convert --registry-mirror {node.registry} -o hostile-out",
             timeout=300, check=True)
    proc = node.run("cd ~ && C2S_FORCE_BUILD=1 hostile-out/run.sh build", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # %setup would have run these as hpc on the node, with its $HOME
    assert not list(node.home.glob("c2s-pwned-by-*"))
    sif = next((node.home / "hostile-out" / "sif").glob("*.sif")).name
    out = node.run(f"apptainer exec ~/hostile-out/sif/{sif} sh -c 'ls /root; echo $NOTE $TEMPLATE'", check=True).stdout.split()
    # the lines ran in %post, in the container (fakeroot's $HOME is /root); the values kept exactly,
    # {{ HOME }} not taken for an Apptainer build argument
    assert out == ["c2s-pwned-by-exec-form", "c2s-pwned-by-shell-form", "%setup", "{{", "HOME", "}}"]

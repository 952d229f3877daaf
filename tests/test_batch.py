"""`compose2sif batch`: PJM and Slurm job scripts for the vllm-tp stacks, on 1 and 2 nodes.

The scripts must pass `bash -n` and shellcheck, carry every compose value as one quoted word, and
their shell helpers (node list, rank, interface) must do what the scheduler's environment says.
The stacks themselves must load exactly as Docker Compose loads them."""
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oracle import base_env, differences, oracle_mark, run_oracle, run_ours

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "stacks"
TP4 = STACKS / "vllm-tp" / "qwen3-32b-tp4" / "compose.yaml"
PP2 = STACKS / "vllm-tp" / "llama-70b-tp4-pp2" / "compose.yaml"
CI = bool(os.environ.get("CI"))


def c2s(*args, cwd=REPO, env=None):
    return subprocess.run([sys.executable, "-m", "compose2sif", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def render(tmp_path, compose, scheduler, *extra):
    out = tmp_path / f"job-{scheduler}.sh"
    proc = c2s("-f", str(compose), "batch", "--scheduler", scheduler, "--group", "gpu-grp", "-o", str(out), *extra)
    assert proc.returncode == 0, proc.stderr
    return out, out.read_text(), proc.stderr


def values(script: str) -> dict:
    """The header's NAME=VALUE assignments, as bash reads them."""
    names = ["nodes", "gpus_per_node", "sif", "serve_args", "sif_opts", "launcher", "port", "cache_dir"]
    dump = "; ".join(f'printf "%s\\0" {n} "${{#{n}[@]}}" "${{{n}[@]}}"' for n in names)
    header = script.split("set -uo pipefail")[0]
    raw = subprocess.run(["bash", "-c", header + "\n" + dump], capture_output=True, text=True, check=True).stdout
    words, out = raw.split("\0")[:-1], {}
    while words:
        name, count = words[0], int(words[1])
        out[name], words = words[2:2 + count], words[2 + count:]
    return out


@pytest.mark.parametrize("scheduler", ["pjm", "slurm"])
@pytest.mark.parametrize("compose,nodes", [(TP4, 1), (PP2, 2)])
def test_job_scripts_render_and_pass_bash_n_and_shellcheck(tmp_path, compose, nodes, scheduler):
    script, text, stderr = render(tmp_path, compose, scheduler, "--module", "cuda/12.4", "--elapse", "2:30:00")
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if scheduler == "pjm":
        for line in ("#PJM -L rscgrp=gpu-grp", f"#PJM -L node={nodes}", "#PJM -L gpu=4", "#PJM -L elapse=2:30:00"):
            assert line in text.splitlines()
    else:
        for line in ("#SBATCH --partition=gpu-grp", f"#SBATCH --nodes={nodes}", "#SBATCH --gpus-per-node=4",
                     "#SBATCH --time=2:30:00"):
            assert line in text.splitlines()
    assert "    module load cuda/12.4" in text.splitlines()
    # the TP=4 stack publishes on 127.0.0.1 for `up`; a job serves on the node's ib0 address instead
    assert ("WARN services.vllm.ports: 127.0.0.1:8000:8000 is not used" in stderr) == (compose == TP4), stderr
    got = values(text)
    assert got["nodes"] == [str(nodes)] and got["gpus_per_node"] == ["4"]
    assert ("--distributed-executor-backend=ray" in got["serve_args"]) == (nodes == 2)
    assert got["launcher"][0] == ("mpiexec" if scheduler == "pjm" else "srun")
    if shutil.which("shellcheck") is None:
        if CI:
            pytest.fail("shellcheck is not installed")
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    check = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


HOSTILE = "$(touch /tmp/c2s-pwned) `id` ' \" ; & | > *"


def test_every_compose_value_is_one_quoted_word(tmp_path):
    project = tmp_path / "p"
    (project / "models").mkdir(parents=True)
    quoted = json.dumps(HOSTILE.replace("$", "$$"))  # a YAML string; $$ is Compose's literal $
    (project / "compose.yaml").write_text(f"""
services:
  llm:
    image: example/llm
    x-compose2sif: {{image: {{sif: ./llm.sif}}}}
    command: ["/models/m", "--served-model-name", {quoted}, "--host", "0.0.0.0", "--port", "9000"]
    environment:
      API_KEY: {quoted}
    volumes: ["./models:/models:ro"]
""")
    _, text, _ = render(tmp_path, project / "compose.yaml", "slurm")
    got = values(text)
    assert got["serve_args"] == ["/models/m", "--served-model-name", HOSTILE, "--port", "9000"]  # --host: the job's
    assert got["port"] == ["9000"]
    assert got["sif"] == [str(project / "llm.sif")]
    assert got["sif_opts"] == ["--bind", f"{project}/models:/models:ro", "--bind", f"{project}/cache:/cache"]
    assert f"pass_env API_KEY {shlex.quote(HOSTILE)}" in text
    assert not Path("/tmp/c2s-pwned").exists()


def test_bad_input_is_one_line_naming_file_service_and_key(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    compose = project / "compose.yaml"
    compose.write_text("services:\n  llm:\n    image: example/llm\n    volumes: [data:/data]\nvolumes: {data: {}}\n")
    proc = c2s("-f", str(compose), "batch", "--scheduler", "pjm", "--group", "g", "--sif", "x.sif")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(compose) in proc.stderr and "services.llm.volumes" in proc.stderr, proc.stderr
    proc = c2s("-f", str(compose), "batch", "--scheduler", "slurm", "--elapse", "90 minutes", "--sif", "x.sif")
    assert proc.returncode == 1 and "--elapse" in proc.stderr
    proc = c2s("-f", str(TP4), "batch", "--scheduler", "slurm", "--job-output", "x.out\nrm -rf ~")
    assert proc.returncode == 1 and "--job-output" in proc.stderr and "Traceback" not in proc.stderr
    proc = c2s("-f", str(TP4), "batch", "--scheduler", "pjm")
    assert proc.returncode == 1 and "rscgrp" in proc.stderr


def test_unused_keys_get_a_warning_each(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "compose.yaml").write_text("services:\n  llm:\n    image: example/llm\n    restart: always\n"
                                          "    shm_size: 1g\n    x-compose2sif: {image: {sif: ./llm.sif}}\n")
    _, _, stderr = render(tmp_path, project / "compose.yaml", "slurm")
    assert "WARN services.llm.restart: not used by the batch job" in stderr
    assert "WARN services.llm.shm_size: not used by the batch job" in stderr


def _helpers(script: Path, env: dict, call: str, args=()) -> str:
    """Run one of the job script's shell functions with a scheduler's environment and the script's ARGS."""
    text = script.read_text()
    functions = text.split("set -uo pipefail")[1].rsplit('\nif [ "${1:-}" = --node ]', 1)[0]
    functions = functions.replace('runtime=$(command -v apptainer || command -v singularity) || {', 'true || {')
    proc = subprocess.run(["bash", "-c", text.split("set -uo pipefail")[0] + functions + "\n" + call, "job.sh",
                           *args], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_node_lists_and_ranks_come_from_the_scheduler(tmp_path):
    script, _, _ = render(tmp_path, PP2, "slurm")
    hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    slurm = _helpers(script, {"SLURM_JOB_NODELIST": "gpu[008-010,012],login1,x[1-2]"}, "node_names")
    assert slurm.split() == ["gpu008", "gpu009", "gpu010", "gpu012", "login1", "x1", "x2"]
    nodeinf = tmp_path / "nodeinf"
    nodeinf.write_text(f"other1\n{hostname}.example.org\n")
    assert _helpers(script, {"PJM_O_NODEINF": str(nodeinf)}, "my_rank").strip() == "1"
    assert _helpers(script, {"SLURM_JOB_NODELIST": "a,b", "SLURM_NODEID": "1"}, "my_rank").strip() == "1"
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    if addresses:  # a node list of addresses (some PJM sites)
        nodeinf.write_text(f"198.51.100.1\n198.51.100.2\n{addresses[0]}\n")  # TEST-NET-2: not ours
        assert _helpers(script, {"PJM_O_NODEINF": str(nodeinf)}, "my_rank").strip() == "2"


def test_node_parts_take_job_dir_and_node_list_from_the_batch_step(tmp_path):
    """A launcher (mpiexec) need not pass PJM's environment on: `--node JOB_DIR` and JOB_DIR/nodes suffice."""
    script, _, _ = render(tmp_path, PP2, "pjm")
    hostname = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    job_dir = tmp_path / "submit" / ".compose2sif-batch" / "123.pjm"
    job_dir.mkdir(parents=True)
    (job_dir / "nodes").write_text(f"head-node\n{hostname}\n")
    out = _helpers(script, {}, 'echo "$job_dir $job_id $(my_rank)"', ["--node", str(job_dir)])
    assert out.split() == [str(job_dir), "123.pjm", "1"]


def test_interface_by_name_with_a_fallback(tmp_path):
    script, _, _ = render(tmp_path, PP2, "pjm")
    name, addr = _helpers(script, {}, "iface=lo; choose_interface").split()
    assert (name, addr) == ("lo", "127.0.0.1")
    fallback = subprocess.run(["bash", "-c", "ip -o -4 route get 192.0.2.1"], capture_output=True, text=True)
    if fallback.returncode != 0:
        pytest.skip("this machine has no default route to fall back to")
    name, addr = _helpers(script, {}, "iface=no-such-if0; choose_interface 2>/dev/null").split()
    assert f"dev {name}" in fallback.stdout and f"src {addr}" in fallback.stdout


@oracle_mark()
@pytest.mark.parametrize("compose", [TP4, PP2], ids=["tp4", "tp4-pp2"])
def test_stacks_load_as_docker_compose_loads_them(tmp_path, compose):
    work = tmp_path / compose.parent.name
    shutil.copytree(compose.parent, work)
    env = base_env({})
    rc_theirs, theirs, err = run_oracle([], work, env)
    assert rc_theirs == 0, err
    rc_ours, ours, err = run_ours([], work, env)
    assert rc_ours == 0, err
    assert differences(ours, theirs) == []


@oracle_mark()
@pytest.mark.parametrize("name", ["compose.yaml", "compose.remote.yaml"])
def test_dify_vllm_loads_as_docker_compose_loads_it(tmp_path, name):
    """With a copy of Dify 1.17.1's docker/ directory standing in for the user's checkout."""
    dify = REPO.parent / "shared" / "reference" / "dify-1.17.1"
    if not dify.is_dir():
        raise AssertionError(f"{dify} is missing: ../shared must be beside the repository")
    shutil.copytree(dify, tmp_path / "docker")
    # the user's .env, copied from .env.example, with an allow-list of its own
    (tmp_path / "docker" / ".env").write_text("SSRF_PROXY_ALLOW_PRIVATE_IPS=192.0.2.0/24\n")
    shutil.copytree(STACKS / "vllm-tp", tmp_path / "stacks" / "vllm-tp")
    shutil.copytree(STACKS / "dify-vllm", tmp_path / "stacks" / "dify-vllm")
    work = tmp_path / "stacks" / "dify-vllm"
    env = base_env({"DIFY_DOCKER_DIR": str(tmp_path / "docker")})
    rc_theirs, theirs, err = run_oracle(["-f", name], work, env)
    assert rc_theirs == 0, err
    rc_ours, ours, err = run_ours(["-f", name], work, env)
    assert rc_ours == 0, err
    assert differences(ours, theirs) == []
    assert ("vllm" in ours["services"]) == (name == "compose.yaml")
    allowed = ours["services"]["ssrf_proxy"]["environment"]["SSRF_PROXY_ALLOW_PRIVATE_IPS"]
    assert allowed == ""  # dify-vllm.env, read after Dify's .env, has the last word (see its comments)

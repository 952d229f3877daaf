"""A converted project as a Slurm job on a real Slurm (Debian's, on the test bed: slurmbed.py):
`compose2sif batch --scheduler slurm` writes the job, sbatch runs it on the first fake node, the
stack comes up and answers on its published port, and scancel leaves nothing (no instance, no
process of hpc on either node, no job folder).

Run under the shared e2e lock:  flock /tmp/c2s-e2e.lock python3 -m pytest --e2e -q tests/e2e/test_slurm.py
"""
import json
import time

import pytest

pytestmark = pytest.mark.e2e

PORT = 18095
# two services from the test bed's images: a web server that waits for a healthy Redis
STACK = f"""\
name: slurmtest
services:
  web:
    image: c2s/python:test
    command: [python3, -m, http.server, "{PORT}", --directory, /srv]
    ports: ["{PORT}:{PORT}"]
    volumes:
      - ./www:/srv:ro
    depends_on:
      cache: {{condition: service_healthy}}
  cache:
    image: c2s/redis:test
    command: [redis-server, --save, ""]
    healthcheck:
      test: [CMD, redis-cli, ping]
      interval: 1s
      retries: 30
"""


def _answers(slurm) -> str:
    return slurm.run(f"curl -fsS -m 5 http://10.251.0.1:{PORT}/", rank=1, timeout=30).stdout


def _job_state(slurm, job: str) -> str:
    return slurm.run(f"squeue -h -j {job} -o %T", timeout=30).stdout.strip()


def test_slurm_job_runs_the_stack_answers_and_scancel_leaves_nothing(slurm):
    stack = slurm.home / "slurmtest"
    slurm.run("rm -rf ~/slurmtest && mkdir -p ~/slurmtest/www", rank=None, check=True)
    (stack / "compose.yaml").write_text(STACK)
    (stack / "www" / "index.html").write_text("served by a Slurm job\n")
    slurm.run(f"cd ~ && python3 -m compose2sif -f slurmtest/compose.yaml convert --registry-mirror {slurm.registry} "
              "-o slurmtest/out && slurmtest/out/run.sh build", rank=None, timeout=900, check=True)
    # on the login node (the first fake node, where sinfo reaches slurmctld): the job for the whole project
    written = slurm.run("cd ~ && python3 -m compose2sif batch --dir slurmtest/out --scheduler slurm "
                        "--elapse 0:20:00 -o slurmtest/job.sh", check=True)
    assert "WARN" not in written.stderr, written.stderr
    job_text = (stack / "job.sh").read_text()
    assert "#SBATCH --nodes=1" in job_text and "#SBATCH --gpus-per-node" not in job_text, job_text
    job = slurm.run("cd ~/slurmtest && sbatch --parsable job.sh", check=True).stdout.strip().split(";")[0]
    output = stack / f"slurmtest.{job}.out"
    try:
        deadline = time.time() + 300
        while "served by a Slurm job" not in _answers(slurm):
            state = _job_state(slurm, job)
            assert state in ("PENDING", "RUNNING", "CONFIGURING"), \
                f"job {job} is {state or 'gone'}:\n{output.read_text() if output.exists() else ''}\n{slurm.logs()}"
            assert time.time() < deadline, f"no answer in 300 s:\n{output.read_text() if output.exists() else ''}"
            time.sleep(2)
        assert _job_state(slurm, job) == "RUNNING"
        log = output.read_text()
        assert "from your machine: ssh -N -L 18095:127.0.0.1:18095 -J hpc@c2s-slurm0 hpc@c2s-slurm0" in log, log
        instances = slurm.run("apptainer instance list --json", timeout=60, check=True).stdout
        assert sorted(i["instance"] for i in json.loads(instances)["instances"]) == ["slurmtest-cache",
                                                                                   "slurmtest-web"]

        started = time.time()
        slurm.run(f"scancel {job}", check=True)
        while _job_state(slurm, job):
            assert time.time() < started + 90, f"job {job} still {_job_state(slurm, job)} 90 s after scancel"
            time.sleep(1)
        stopped = time.time() - started
        deadline = time.time() + 30
        while slurm.processes(user="hpc") and time.time() < deadline:  # orphans reaped by init: a bounded wait
            time.sleep(1)
        assert slurm.processes(user="hpc") == ""
        assert json.loads(slurm.run("apptainer instance list --json", timeout=60, check=True).stdout)["instances"] == []
        assert not (stack / ".compose2sif-batch").exists()
        log = output.read_text()
        assert "[c2s-batch c2s-slurm0] stopped" in log, log
        assert stopped < 60, f"scancel took {stopped:.0f} s"
    finally:
        slurm.run(f"scancel {job}")

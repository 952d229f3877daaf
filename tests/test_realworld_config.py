"""`compose2sif config --format json` equals Docker Compose's on every key of the 39 real-world
projects in ../shared/realworld/ (third-party files, see each PROVENANCE.md), each loaded the way its
README says (directory, -f files, profiles). Differences allowed: oracle.DOCUMENTED_DIFFERENCES only.

No project needs anything beyond the files stored with it: those whose docs say `cp .env.example .env`
have that .env stored beside their compose file.
"""
from pathlib import Path

import pytest

from oracle import base_env, differences, oracle_mark, run_oracle, run_ours

REALWORLD = Path(__file__).resolve().parent.parent.parent / "shared" / "realworld"

# name -> (directory in the project, docker compose arguments), from each PROVENANCE.md
PROJECTS = {
    "airflow": ("airflow", ["--profile", "flower"]),
    "anythingllm": ("anythingllm/docker", []),
    "bisheng": ("bisheng/docker", ["-f", "docker-compose.yml", "-p", "bisheng"]),
    "cognita": ("cognita", []),
    "coze-studio": ("coze-studio/docker", ["-f", "docker-compose.yml"]),
    "directus": ("directus", []),
    "fastgpt": ("fastgpt", []),
    "flowise": ("flowise", ["-f", "docker-compose-queue-prebuilt.yml"]),
    "immich": ("immich", []),
    "immich-cuda": ("immich", ["-f", "docker-compose.cuda.yml"]),
    "khoj": ("khoj", []),
    "langfuse": ("langfuse", []),
    "librechat": ("librechat", []),
    "lobechat": ("lobechat", []),
    "mattermost": ("mattermost", ["-f", "docker-compose.yml", "-f", "docker-compose.nginx.yml"]),
    "mem0": ("mem0/server", []),
    "milvus-cluster": ("milvus-cluster", []),
    "n8n-ai-starter": ("n8n-ai-starter", ["--profile", "gpu-nvidia"]),
    "nextcloud-fpm": ("nextcloud-fpm", []),
    "opik": ("opik/deployment/docker-compose", []),
    "onyx": ("onyx/deployment/docker_compose", []),
    "open-webui": ("open-webui", ["-f", "docker-compose.yaml", "-f", "docker-compose.gpu.yaml",
                                  "-f", "docker-compose.api.yaml"]),
    "paperless-ngx": ("paperless-ngx/docker/compose", ["-f", "docker-compose.postgres-tika.yml"]),
    "penpot": ("penpot", []),
    "plane": ("plane", ["--env-file", "plane.env"]),
    "plausible": ("plausible", []),
    "prefect": ("prefect", []),
    "qanything": ("qanything", ["-f", "docker-compose-linux.yaml"]),
    "r2r": ("r2r/docker", ["-f", "compose.full.yaml", "--profile", "postgres"]),
    "ragflow": ("ragflow", []),
    "sentry-self-hosted": ("sentry-self-hosted", []),
    "supabase": ("supabase", []),
    "superagi": ("superagi", []),
    "surfsense": ("surfsense/docker", []),
    "taskingai": ("taskingai/docker", []),
    "temporal": ("temporal", ["-f", "docker-compose-multirole.yaml"]),
    "weblate": ("weblate", []),
    "weblate-split": ("weblate", ["-f", "docker-compose-split.yml", "-f", "docker-compose.override.yml"]),
    "windmill": ("windmill", []),
    "zep-ce": ("zep-ce/legacy", ["-f", "docker-compose.ce.yaml"]),
    "zulip": ("zulip", []),
}

pytestmark = oracle_mark()


def test_every_stored_project_is_compared():
    if not REALWORLD.is_dir():
        pytest.fail(f"{REALWORLD} is missing: ../shared must be beside the repository")
    stored = {p.name for p in REALWORLD.iterdir() if p.is_dir()}
    assert stored == {where.split("/")[0] for where, _ in PROJECTS.values()}


@pytest.mark.parametrize("name", sorted(PROJECTS))
def test_matches_docker_compose_on_every_key(name):
    where, args = PROJECTS[name]
    cwd = REALWORLD / where
    if not cwd.is_dir():
        pytest.fail(f"{cwd} is missing: ../shared must be beside the repository")
    env = base_env({})
    rc, theirs, err = run_oracle(args, cwd, env)
    assert rc == 0, f"the oracle rejected {name}: {err}"
    rc, ours, err = run_ours(args, cwd, env)
    assert rc == 0, f"compose2sif rejected what Docker Compose accepts: {err}"
    problems = differences(ours, theirs)
    assert not problems, "\n".join(problems)

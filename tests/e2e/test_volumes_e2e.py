"""Volumes and host files as under Docker, on real rootless Apptainer as the unprivileged user:
named and anonymous volumes filled from the image, a bind below an anonymous volume, /etc/localtime
and the Docker socket, what lives across down/up, a host path nobody can create, a database image's
VOLUME across restart, and an image's EXPOSE port that another service really holds."""
import pytest

pytestmark = pytest.mark.e2e

OUT = "out-volumes"
REDIS = "/usr/lib/python3/dist-packages/redis"


def test_volumes_are_filled_ordered_and_kept_as_under_docker(node):
    node.copy_stack("volumes-stack", source="volumes-stack")
    node.run(f"cd ~ && rm -rf {OUT}")
    up = f"-f volumes-stack/compose.yaml up -d --registry-mirror {node.registry} -o {OUT}"
    exec_in = lambda service, script: node.run(f"cd ~ && {OUT}/run.sh exec {service} sh -c '{script}'",  # noqa: E731
                                               timeout=120)
    try:
        proc = node.c2s(up, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Docker socket" in proc.stderr and "no Docker daemon" in proc.stderr
        # the anonymous volume holds the image's code, and the bind below it is not hidden
        code = exec_in("app", f"test -s {REDIS}/__init__.py && cat {REDIS}/extra/marker")
        assert code.returncode == 0 and code.stdout.strip() == "bound below", code.stdout + code.stderr
        # the named volume was filled from app's image, and the second service (its profiles ["", ...]
        # active with no profile asked for) reads it
        read = exec_in("reader", "test -s /mnt/psycopg2/__init__.py && echo ok")
        assert read.stdout.strip() == "ok", read.stdout + read.stderr
        # ... as the image has it (reader's own image shows the original): modes, times, contents, links
        listing = "find . -printf \"%p %y %m %T@ %l\\n\" | sort; find . -type f -exec md5sum {} + | sort"
        filled = exec_in("reader", f"cd /mnt/psycopg2 && {listing}")
        original = exec_in("reader", f"cd /usr/lib/python3/dist-packages/psycopg2 && {listing}")
        assert filled.returncode == 0 and len(filled.stdout.splitlines()) > 5, filled.stdout + filled.stderr
        assert filled.stdout == original.stdout, filled.stdout + original.stdout
        zone = exec_in("app", "test -e /etc/localtime && echo ok; test -e /var/run/docker.sock || echo no-socket")
        assert zone.stdout.split() == ["ok", "no-socket"], zone.stdout + zone.stderr
        # a change in the named volume survives down/up; the anonymous volume is fresh after it
        assert exec_in("app", "echo changed >> /usr/lib/python3/dist-packages/psycopg2/__init__.py; "
                       f"echo mine > {REDIS}/mine").returncode == 0
        node.run(f"cd ~ && {OUT}/run.sh down", check=True, timeout=120)
        node.run(f"cd ~ && {OUT}/run.sh up -d", check=True, timeout=300)
        kept = exec_in("reader", "tail -n 1 /mnt/psycopg2/__init__.py")
        assert kept.stdout.strip() == "changed", kept.stdout + kept.stderr
        fresh = exec_in("app", f"test -e {REDIS}/mine && echo stale; test -s {REDIS}/__init__.py && echo filled")
        assert fresh.stdout.split() == ["filled"], fresh.stdout + fresh.stderr
    finally:
        node.run(f"cd ~ && {OUT}/run.sh down", timeout=120)


def test_a_host_path_the_user_cannot_create_stops_up_before_anything_starts(node):
    node.copy_stack("volumes-stack", source="volumes-stack")
    out = f"{OUT}-missing"
    node.run(f"cd ~ && rm -rf {out}")
    try:
        proc = node.c2s(f"-f volumes-stack/compose.missing.yaml up -d --registry-mirror {node.registry} -o {out}",
                        timeout=900)
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if "/c2s-not-creatable/data" in line and "run.sh" in line]
        assert len(lines) == 1 and "service app" in lines[0] and "override file" in lines[0], proc.stderr
        assert "nothing was started" in proc.stderr
        listing = node.run("apptainer instance list", timeout=60)
        assert "c2s-volumes-missing" not in listing.stdout
    finally:
        node.run(f"cd ~ && {out}/run.sh down", timeout=120)


def test_a_database_image_volume_keeps_its_data_across_restart(node):
    node.copy_stack("volumes-stack", source="volumes-stack")
    out = f"{OUT}-db"
    node.run(f"cd ~ && rm -rf {out}")
    psql = f"cd ~ && {out}/run.sh exec db sh -c 'PGPASSWORD=example-only-password psql -h localhost -U postgres -tAc \"{{}}\"'"
    try:
        proc = node.c2s(f"-f volumes-stack/compose.db.yaml up -d --registry-mirror {node.registry} -o {out}",
                        timeout=1500)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        node.run(psql.format("CREATE TABLE kept (x int); INSERT INTO kept VALUES (27)"), check=True, timeout=60)
        node.run(f"cd ~ && {out}/run.sh restart db", check=True, timeout=300)
        kept = node.run(psql.format("SELECT x FROM kept"), timeout=60)
        assert kept.stdout.strip() == "27", kept.stdout + kept.stderr
    finally:
        node.run(f"cd ~ && {out}/run.sh down", timeout=120)


def test_an_exposed_port_that_is_another_services_real_port_blocks_nothing(node):
    node.copy_stack("volumes-stack", source="volumes-stack")
    out = f"{OUT}-expose"
    node.run(f"cd ~ && rm -rf {out}")
    try:
        proc = node.c2s(f"-f volumes-stack/compose.expose.yaml up -d --registry-mirror {node.registry} -o {out}",
                        timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for _ in range(2):  # the web server holds 8000, the worker's EXPOSE: it restarts all the same
            restart = node.run(f"cd ~ && {out}/run.sh restart worker", timeout=300)
            assert restart.returncode == 0, restart.stdout + restart.stderr
        assert node.run(f"cd ~ && {out}/run.sh ps", timeout=60).stdout.count("running") >= 2
    finally:
        node.run(f"cd ~ && {out}/run.sh down", timeout=120)

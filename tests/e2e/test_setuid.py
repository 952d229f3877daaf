"""The setuid test bed (issue 19): Apptainer 1.4.5 installed setuid, on a node where the user
cannot make user namespaces (the seed's kind of cluster; see provision.sh and enter.sh). What a
user can and cannot do there by hand, and what doctor says of it; doctor on the rootless node too."""
import os
import re

import pytest


pytestmark = pytest.mark.e2e
STARTSCRIPT = "#!/bin/sh\n# the start script, bound in at instance start\necho started >/tmp/c2s-setuid-started\nexec sleep 300\n"


def test_the_runtime_is_setuid_and_user_namespaces_are_off(setuid_node):
    proc = setuid_node.run("apptainer buildcfg APPTAINER_SUID_INSTALL; cat /proc/sys/user/max_user_namespaces; "
                           "unshare --user true; echo unshare=$?", check=True)
    assert proc.stdout.split() == ["1", "0", "unshare=1"], proc.stdout + proc.stderr
    assert "Operation not permitted" in proc.stderr


def test_registry_images_build_and_definition_files_need_fakeroot(setuid_node):
    reg = setuid_node.registry
    proc = setuid_node.run(f"cd /tmp && apptainer build x.sif docker://{reg}/c2s/nginx:test && "
                           "apptainer inspect --runscript x.sif | head -2", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OCI_ENTRYPOINT='\"/docker-entrypoint.sh\"'" in proc.stdout
    definition = f"Bootstrap: docker\nFrom: {reg}/c2s/nginx:test\n"
    proc = setuid_node.run(f"cd /tmp && printf %s '{definition}' > y.def && apptainer build y.sif y.def", timeout=600)
    assert proc.returncode != 0
    assert "/etc/subuid mapping found but no user namespace available for fakeroot" in proc.stderr, proc.stderr[-2000:]


def test_an_instance_runs_a_start_script_bound_in_at_start(setuid_node):
    reg = setuid_node.registry
    script = setuid_node.home / "startscript"
    script.write_text(STARTSCRIPT)
    script.chmod(0o755)
    os.chown(script, int(setuid_node.uid), int(setuid_node.uid))
    proc = setuid_node.run(
        f"cd ~ && apptainer build -F web.sif docker://{reg}/c2s/nginx:test >/dev/null 2>&1 && "
        "apptainer instance start --bind ~/startscript:/.singularity.d/startscript:ro web.sif c2s-setuid-web && "
        "sleep 1 && apptainer exec instance://c2s-setuid-web cat /tmp/c2s-setuid-started; "
        "apptainer instance stop c2s-setuid-web", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "started" in proc.stdout, proc.stdout + proc.stderr


def test_a_directory_overlay_is_mounted_for_the_user(setuid_node):
    """Apptainer installed setuid takes a user's directory as --overlay (kernel overlayfs): the claim
    that setuid installs refuse it holds for SingularityCE only (docs/writable-paths.md). The
    service runs as the user there, so the image's root-owned directories stay unwritable."""
    reg = setuid_node.registry
    proc = setuid_node.run(
        f"cd ~ && rm -rf ov && mkdir ov && apptainer build -F ov.sif docker://{reg}/c2s/nginx:test >/dev/null 2>&1 && "
        "apptainer exec --overlay ov ov.sif sh -c 'grep \" / \" /proc/mounts; echo x >/var/x' ; ls ov", timeout=600)
    assert re.search(r"^overlay / overlay .*upperdir=", proc.stdout, re.M), proc.stdout + proc.stderr
    assert proc.stdout.split()[-2:] == ["upper", "work"], proc.stdout
    assert "cannot create /var/x: Permission denied" in proc.stderr


def test_doctor_says_setuid_and_what_cannot_be_built(setuid_node):
    proc = setuid_node.c2s("doctor", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("ok   mode: setuid (APPTAINER_SUID_INSTALL=1") for line in lines), proc.stdout
    assert any(line.startswith("warn definition files (Dockerfile builds, curated definitions) cannot be built here")
               for line in lines), proc.stdout
    assert not any("squashfuse" in line or "fuse-overlayfs" in line for line in lines), proc.stdout


def test_doctor_on_the_rootless_node_says_unprivileged(node):
    proc = node.c2s("doctor", timeout=300)
    assert "ok   mode: unprivileged (`apptainer buildcfg` says APPTAINER_SUID_INSTALL=0)" in proc.stdout, proc.stdout
    assert "ok   definition files build here with fakeroot (hpc has a range in /etc/subuid)" in proc.stdout


def test_images_that_cannot_be_built_are_refused_before_anything_starts_and_a_dropped_sif_is_used(setuid_node):
    """Every image has a definition file today, so on this node each one needs fakeroot: `up` says
    which in one line before anything starts; a SIF copied to the path that line names is used."""
    reg = setuid_node.registry
    setuid_node.copy_stack("build-stack", source="build-stack")
    setuid_node.run("cd ~ && rm -rf setuid-build-out")
    proc = setuid_node.c2s(f"-f build-stack/compose.yaml up -d --registry-mirror {reg} -o setuid-build-out",
                           timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = re.search(r"^run\.sh: image (\S+) cannot be built here: its definition needs fakeroot \(setuid apptainer, "
                      r"no user namespaces\); build it where user namespaces or root exist \(run\.sh build there\) and "
                      r"copy it to (\S+)\.sif, or use --remote where the site has a build service$", proc.stderr, re.M)
    assert found, proc.stderr
    assert "FATAL" not in proc.stderr  # nothing was tried
    listed = setuid_node.run("apptainer instance list", check=True).stdout
    assert "hello" not in listed, listed
    # a SIF built elsewhere, put where the line says (one from the registry will do for run.sh build)
    proc = setuid_node.run(f"apptainer build {found.group(2)}.sif docker://{reg}/c2s/nginx:test", timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = setuid_node.run("cd ~ && setuid-build-out/run.sh build", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "used as given" in proc.stderr, proc.stderr

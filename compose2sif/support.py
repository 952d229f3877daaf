"""What compose2sif does with every service key of the Compose Specification.

One table, three kinds of support:

* handled     - does what Docker Compose does.
* emulated    - the effect is reproduced with Apptainer's means (the note says how).
* unsupported - cannot be honoured by a rootless Apptainer instance; the loader warns, naming the
                service and the key, and the note says what happens instead.

``docs/support.md`` is rendered from this table (``python -m compose2sif.support > docs/support.md``)
and a test fails when the Compose Specification has a service key this table does not classify.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple

HANDLED, EMULATED, UNSUPPORTED = "handled", "emulated", "unsupported"


class KeySupport(NamedTuple):
    status: str
    note: str


def _h(note: str) -> KeySupport:
    return KeySupport(HANDLED, note)


def _e(note: str) -> KeySupport:
    return KeySupport(EMULATED, note)


def _u(note: str) -> KeySupport:
    return KeySupport(UNSUPPORTED, note)


_NO_CGROUPS = ("rootless Apptainer without cgroup v2 cannot limit resources; the key is ignored and "
               "the batch scheduler's allocation is the limit")

SERVICE_KEYS: Dict[str, KeySupport] = {
    "annotations": _u("container annotations have no Apptainer equivalent; ignored"),
    "attach": _h("log attachment; instance logs are always kept and shown by `logs`"),
    "blkio_config": _u(_NO_CGROUPS),
    "build": _h("converted to a Singularity definition file and built into a SIF; a Dockerfile FROM an image "
                "another service builds starts from that service's SIF, built first"),
    "cap_add": _u("an unprivileged instance cannot gain capabilities; ignored"),
    "cap_drop": _u("instances already run with the caller's (unprivileged) capabilities; ignored"),
    "cgroup": _u("no cgroup namespace control without root; ignored"),
    "cgroup_parent": _u("no cgroup control without root; ignored"),
    "command": _h("replaces the image's CMD in the generated start script"),
    "configs": _e("bound read-only at /<name> or its target; `file` binds the file, `environment` and "
                  "`content` are written into the output dir (0600) and bound; `external` is an error; "
                  "uid/gid/mode are not applied (warning)"),
    "container_name": _h("used as the instance name and as a host name for the other services"),
    "cpu_count": _u(_NO_CGROUPS), "cpu_percent": _u(_NO_CGROUPS), "cpu_period": _u(_NO_CGROUPS),
    "cpu_quota": _u(_NO_CGROUPS), "cpu_rt_period": _u(_NO_CGROUPS), "cpu_rt_runtime": _u(_NO_CGROUPS),
    "cpu_shares": _u(_NO_CGROUPS), "cpus": _u(_NO_CGROUPS), "cpuset": _u(_NO_CGROUPS),
    "credential_spec": _u("Windows-only; ignored"),
    "depends_on": _h("start order and the service_started / service_healthy / "
                     "service_completed_successfully conditions"),
    "deploy": _e("GPU device reservations select GPUs; replicas above 1, placement and resource "
                 "limits are ignored with a warning"),
    "develop": _u("compose watch is a development feature; ignored"),
    "device_cgroup_rules": _u("no device cgroup without root; ignored"),
    "devices": _e("the device node is bound into the instance; access follows the caller's permissions"),
    "dns": _u("the node's resolver answers (under the per-service loopback through Docker's DNS, 127.0.0.11, "
                "which relays to it); ignored"),
    "dns_opt": _u("the node's resolver answers (under the per-service loopback through Docker's DNS, 127.0.0.11, "
                "which relays to it); ignored"),
    "dns_search": _u("the node's resolver answers (under the per-service loopback through Docker's DNS, 127.0.0.11, "
                "which relays to it); ignored"),
    "domainname": _u("instances share the host's UTS namespace; ignored"),
    "entrypoint": _h("replaces the image's ENTRYPOINT in the generated start script"),
    "env_file": _h("read with Docker Compose's rules and merged into the environment"),
    "environment": _h("written to a private env file passed with --env-file; instances use --cleanenv"),
    "expose": _h("a port the service may listen on, planned on its own address; never a refusal, a moved port "
                 "or a blocked start (as the image's EXPOSE)"),
    "extends": _h("resolved at load time, from the same or another file"),
    "external_links": _u("links to containers outside the project do not exist here; ignored"),
    "extra_hosts": _h("added to the generated hosts file bound as /etc/hosts"),
    "gpus": _e("--nv with CUDA_VISIBLE_DEVICES set to the assigned GPUs"),
    "group_add": _u("an unprivileged instance cannot add groups; ignored"),
    "healthcheck": _h("run with `exec instance://...` on the Compose schedule; gates depends_on; what it leaves "
                      "unset (or all of it) comes from the image's HEALTHCHECK (registry config or Dockerfile)"),
    "hostname": _h("added to the hosts file; the host's UTS namespace is kept, and HOSTNAME in every service's "
                   "environment is the node's host name (what its gethostname() gives), as Docker sets it to the "
                   "container's"),
    "image": _h("built into a SIF with `Bootstrap: docker`"),
    "init": _u("Apptainer instances already run a small init (shim) process; ignored"),
    "ipc": _e("instances share the host's IPC namespace, which covers `host` and `shareable`"),
    "isolation": _u("Windows-only; ignored"),
    "label_file": _h("labels are recorded in the plan"),
    "labels": _h("recorded in the plan; no runtime effect"),
    "links": _e("service names resolve to the service's own loopback address through the hosts file; adds a "
                "dependency"),
    "logging": _e("instance stdout/stderr go to Apptainer's per-instance log files"),
    "mac_address": _u("no network namespace of its own; ignored"),
    "mem_limit": _u(_NO_CGROUPS), "mem_reservation": _u(_NO_CGROUPS),
    "mem_swappiness": _u(_NO_CGROUPS), "memswap_limit": _u(_NO_CGROUPS),
    "models": _u("Docker Model Runner is not available; ignored"),
    "network_mode": _e("every instance uses the host network, each service on a loopback address of its own "
                       "that its names map to in the hosts file; service:X takes X's networks, host the node's "
                       "(untraced), none reaches nothing (docs/isolation.md)"),
    "networks": _e("as written, a service connects only to the services it shares a network with, and beyond "
                   "the project unless all its networks are internal (c2s-loopback refuses the rest); names "
                   "resolve for every service, aliases become host names; with the plan-time knobs nothing "
                   "is isolated (docs/isolation.md)"),
    "oom_kill_disable": _u(_NO_CGROUPS), "oom_score_adj": _u("an unprivileged process can only raise it; ignored"),
    "pid": _e("instances share the host PID namespace, which covers `host`"),
    "pids_limit": _u(_NO_CGROUPS),
    "platform": _u("images are built for the node's own architecture; ignored"),
    "ports": _h("each service keeps its ports on its own loopback address; a port moves only where it must "
                "(privileged, published on another port, or a clash with a service that listens on all "
                "addresses), and the service and its clients are told; published ports bind on their host_ip"),
    "post_start": _u("lifecycle hooks are not run; ignored"),
    "pre_start": _e("each step runs to completion, in order, before the service first starts: a one-off container "
                    "of its image (the service's, or another SIF built or pulled like any other) with the service's "
                    "volumes, binds, environment (the step's added) and working directory; not run again on a "
                    "restart or a later `up` until the step changes or after `down`; a failing step fails the "
                    "service with its output; a step's `user` and `privileged` are ignored (warning)"),
    "pre_stop": _u("lifecycle hooks are not run; ignored"),
    "privileged": _u("an unprivileged user cannot run privileged instances; ignored"),
    "profiles": _h("services are enabled with --profile or COMPOSE_PROFILES"),
    "provider": _u("provider services (external tools) are not run; ignored"),
    "pull_policy": _h("`build` skips SIFs that exist; `always` rebuilds"),
    "pull_refresh_after": _u("images are built once into SIFs; ignored"),
    "read_only": _h("a SIF is read-only; writable paths get binds"),
    "restart": _h("restart policies are honoured by the runner"),
    "runtime": _e("`nvidia` means --nv; other runtimes are ignored with a warning"),
    "scale": _u("one instance per service; values above 1 are ignored"),
    "secrets": _e("bound read-only at /run/secrets/<name> or its target; `file` binds the file, "
                  "`environment` and `content` are written into the output dir (0600, never on a command "
                  "line or in plan.json) and bound; `external` is an error; uid/gid/mode are not applied (warning)"),
    "security_opt": _u("seccomp/AppArmor/SELinux options cannot be set unprivileged; ignored"),
    "shm_size": _e("instances use the host's /dev/shm; its size is the node's"),
    "stdin_open": _u("instances run detached without a terminal; ignored"),
    "stop_grace_period": _h("`down` waits this long before killing an instance"),
    "stop_signal": _h("`down` sends this signal first; unset, the image's STOPSIGNAL (registry config or Dockerfile), else SIGTERM"),
    "storage_opt": _u("no storage driver; ignored"),
    "sysctls": _u("an unprivileged user cannot set kernel parameters; ignored"),
    "tmpfs": _e("a private scratch directory is bound at the path"),
    "tty": _u("instances run detached without a terminal; ignored"),
    "ulimits": _e("soft limits are set with `ulimit` in the start script, up to the caller's hard limits"),
    "use_api_socket": _u("there is no Docker API socket; ignored"),
    "user": _u("Apptainer runs everything as the calling user; ignored (root's id or group 0 gets "
               "--fakeroot where the node gives it: root inside)"),
    "userns_mode": _u("Apptainer chooses the user namespace; ignored"),
    "uts": _u("instances share the host's UTS namespace; ignored"),
    "volumes": _e("bound as Docker mounts them, parents before children (see the volume forms below)"),
    "volumes_from": _e("the other service's volumes are bound too; adds a dependency"),
    "working_dir": _h("passed to Apptainer with --pwd"),
}

# What each form of `volumes:` (and an image's VOLUME) becomes under Apptainer.
VOLUME_FORMS: Dict[str, str] = {
    "named volume (`data:/path`)": "a directory `state/volumes/NAME` of the output directory, bound at the path; "
    "when it is empty at a service's start and the image has content there, that content is copied in first "
    "(Docker's fill rule: modes, links and times kept, files owned by you); lives until `down -v`; `external` "
    "and other drivers become the same directory (warning)",
    "anonymous volume (`/path`)": "a directory `state/anonymous/SERVICE/PATH`, filled as a named volume; lives "
    "across `restart` and the supervisor's restarts, renewed (emptied, filled again) after `down`",
    "image `VOLUME` (Dockerfile, or registry config when online)": "an anonymous volume at its path unless the "
    "service mounts something there: a database's data survives restarts as under Docker",
    "`volume.nocopy: true`": "the volume is never filled from the image",
    "`volume.subpath`": "the subdirectory of the named volume is bound; not filled",
    "bind of a project path (`./dir:/path`)": "bound as it is; a missing directory is created (short syntax, "
    "or `create_host_path`)",
    "bind of a host path outside the project (`/data:/data`)": "bound as it is where it exists (`/etc/localtime`, "
    "a dataset); `convert` warns about one missing here, and `up` creates a missing one where you can, else "
    "stops before anything starts with one line naming the service, the path and the fix (an override file "
    "binding a directory of your choice at the same target)",
    "the Docker socket (`docker.sock` anywhere, `$XDG_RUNTIME_DIR/docker.sock`, where `DOCKER_HOST` points)":
    "no Docker daemon runs under Apptainer: a WARN at `convert` and `up` names the service; bound only where a "
    "socket exists at `up`, never created; the service starts",
    "nested mounts": "mounted parents first (by depth, as Docker), the project's own scratch directories "
    "included; a child's missing mount point is created in its parent's source, as Docker does",
    "`tmpfs` / `type: tmpfs`": "a private directory of the service, emptied at each start; `tmpfs.size` and "
    "`tmpfs.mode` are ignored (warning)",
    "`:ro` / `read_only: true`": "bound read-only",
    "`:z`, `:Z`, `bind.selinux`, `bind.propagation`, `consistency`": "no effect under "
    "Apptainer: ignored, named in a warning",
    "volume `driver_opts` (an NFS or bind-mounted device volume)": "ignored (warning): the volume is its "
    "directory `state/volumes/NAME`",
    "`type: image`, `type: npipe`, `type: cluster`": "not supported: skipped, named in a warning",
}

def unsupported_warnings(name: str, service: dict) -> List[str]:
    """One warning per key of this service that compose2sif cannot honour, in file order."""
    return [f"service {name!r}: `{key}` is not supported under Apptainer: {SERVICE_KEYS[key].note}"
            for key in service if key in SERVICE_KEYS and SERVICE_KEYS[key].status == UNSUPPORTED]


def render_markdown() -> str:
    lines = ["# Compose keys and what compose2sif does with them", "",
             "Generated from `compose2sif/support.py` by `python -m compose2sif.support`; do not edit.", "",
             "`compose2sif config` and `convert` read every key below; `convert` records what it did in "
             "plan.json, and unsupported keys are warned about by name.", "",
             "| key | support | what compose2sif does |", "| --- | --- | --- |"]
    for key in sorted(SERVICE_KEYS):
        entry = SERVICE_KEYS[key]
        lines.append(f"| `{key}` | {entry.status} | {entry.note} |")
    lines += ["", "## Volume forms", "", "| form | under Apptainer |", "| --- | --- |"]
    lines += [f"| {form} | {what} |" for form, what in VOLUME_FORMS.items()]
    counts = {s: sum(1 for e in SERVICE_KEYS.values() if e.status == s) for s in (HANDLED, EMULATED, UNSUPPORTED)}
    lines += ["", f"{counts[HANDLED]} handled, {counts[EMULATED]} emulated, {counts[UNSUPPORTED]} unsupported.",
              "An unsupported key never disappears silently: `config` and `convert` print one warning naming "
              "the service and the key.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_markdown(), end="")

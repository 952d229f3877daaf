#!/usr/bin/env bash
# Run a command on the test bed's Slurm node (provision.sh's SLURM_NODE): its root filesystem entered
# with pivot_root as enter.sh does, but /run kept from that root, so that every daemon and client of
# the fake cluster shares munge's socket, and /tmp a tmpfs of its own (per node: the caller enters
# each fake node's network namespace first).
#   slurm_enter.sh NODE_ROOT REPO_DIR USER COMMAND   (USER: root for the daemons, hpc for the rest)
set -euo pipefail
root=$1 repo=$2 user=$3 command=$4

chmod 0666 /dev/fuse 2>/dev/null || true
exec unshare -m --propagation private /bin/bash -s -- "$root" "$repo" "$user" "$command" <<'INNER'
set -euo pipefail
root=$1 repo=$2 user=$3 command=$4
mount --rbind "$root" "$root"
mount --rbind /proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount --rbind "$repo" "$root/work"
cd "$root"
pivot_root . .oldroot
umount -l /.oldroot
cd /
if [ "$user" = root ]; then
    exec /bin/bash -c "$command"
fi
# compose2sif is the one pip installed in ~/c2s-venv (testbed.install_compose2sif), never /work's
exec su - "$user" -c "export APPTAINER_NOHTTPS=1 PYTHONDONTWRITEBYTECODE=1 PATH=\"\$HOME/c2s-venv/bin:\$PATH\"; $command"
INNER

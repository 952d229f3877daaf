#!/usr/bin/env bash
# Run a command as the unprivileged user `hpc` on the test bed's node: a private mount namespace,
# the node root filesystem entered with pivot_root (user namespaces are refused inside a chroot),
# the host's /proc, /dev and /sys, and the repository at /work. The network namespace is the
# host's, as on a real HPC node.
#   enter.sh NODE_ROOT REPO_DIR COMMAND...   (NODE_ROOT: the NODE printed by provision.sh)
set -euo pipefail
root=$1 repo=$2
shift 2

chmod 0666 /dev/fuse 2>/dev/null || true
exec unshare -m --propagation private /bin/bash -s -- "$root" "$repo" "$@" <<'INNER'
set -euo pipefail
root=$1 repo=$2
shift 2
mount --rbind "$root" "$root"
mount --rbind /proc "$root/proc"
mount --rbind /dev "$root/dev"
mount --rbind /sys "$root/sys"
mount -t tmpfs -o mode=0755 tmpfs "$root/run"
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
mount --rbind "$repo" "$root/work"
cd "$root"
pivot_root . .oldroot
umount -l /.oldroot
cmd=$(printf '%q ' "$@")
exec su - hpc -c "cd /work && $cmd"
INNER

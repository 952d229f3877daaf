#!/usr/bin/env bash
# Run a command as the unprivileged user `hpc` on the test bed's node: a private mount namespace,
# the node root filesystem entered with pivot_root (user namespaces are refused inside a chroot),
# the host's /proc, /dev and /sys, and the repository at /work. The network namespace is the
# host's, as on a real HPC node.
#   enter.sh NODE_ROOT REPO_DIR COMMAND...   (NODE_ROOT: the NODE printed by provision.sh)
# With C2S_HIDE_PYTHON=1 every python binary on the node is hidden (bound over with an empty
# file), to prove that the generated run.sh needs no Python.
set -euo pipefail
root=$1 repo=$2
shift 2

chmod 0666 /dev/fuse 2>/dev/null || true
exec unshare -m --propagation private /bin/bash -s -- "$root" "$repo" "${C2S_HIDE_PYTHON:-0}" "$@" <<'INNER'
set -euo pipefail
root=$1 repo=$2 hide_python=$3
shift 3
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
if [ "$hide_python" = 1 ]; then
    for p in /usr/bin/python3* /usr/local/bin/python3*; do
        [ -e "$p" ] && mount --bind /dev/null "$p"
    done
fi
cmd=$(printf '%q ' "$@")
exec su - hpc -c "cd /work && $cmd"
INNER

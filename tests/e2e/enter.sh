#!/usr/bin/env bash
# Run a command as the unprivileged user `hpc` on the test bed's node: a private mount namespace,
# the node root filesystem entered with pivot_root (user namespaces are refused inside a chroot),
# the host's /proc, /dev and /sys, and the repository at /work. The network namespace is the
# host's, as on a real HPC node.
#   enter.sh NODE_ROOT REPO_DIR COMMAND...   (NODE_ROOT: the NODE printed by provision.sh)
# With C2S_HIDE_PYTHON=1 every python binary on the node is hidden (bound over with an empty
# file), to prove that the generated run.sh needs no Python. With C2S_BLOCK_USERNS=1 the user
# cannot create user namespaces and /proc/sys/user/max_user_namespaces reads 0 (the setuid node).
set -euo pipefail
root=$1 repo=$2
shift 2

chmod 0666 /dev/fuse 2>/dev/null || true
exec unshare -m --propagation private /bin/bash -s -- "$root" "$repo" "${C2S_HIDE_PYTHON:-0}" \
    "${C2S_BLOCK_USERNS:-0}" "$@" <<'INNER'
set -euo pipefail
root=$1 repo=$2 hide_python=$3 block_userns=$4
shift 4
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
last='if [ "$0" = 1 ]; then
    for p in /usr/bin/python3* /usr/local/bin/python3*; do
        [ -e "$p" ] && mount --bind /dev/null "$p"
    done
fi
exec su - hpc -c "$1"'
runner=()
if [ "$block_userns" = 1 ]; then  # as on a node with user namespaces off (tests/e2e/no_userns.py)
    echo 0 >/run/max_user_namespaces
    mount --bind /run/max_user_namespaces /proc/sys/user/max_user_namespaces
    runner=(python3 /work/tests/e2e/no_userns.py)
fi
exec "${runner[@]}" /bin/bash -c "$last" "$hide_python" "cd /work && $cmd"
INNER

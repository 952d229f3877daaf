#!/bin/bash
# Prepares the GPU check for a lent GPU machine (no network there, 64 MiB per transfer): writes .gpu/
# in the repository with
#   - a 2-3 MB image: gpucheck (gpucheck.c) and a shell with a few coreutils, built from the
#     definition compose2sif writes for compose.yaml, its source swapped for that directory;
#   - compose2sif's output directory for compose.yaml (convert --offline), the SIF put in place;
#   - Debian's apptainer and what it needs, taken from the test bed's node (about 16 MB xz);
#   - on-device.sh, which installs them there and runs the stack as an unprivileged user.
# Run as root on a machine with the e2e test bed provisioned:
#   tests/gpu/prepare.sh NODE_ROOT      (NODE_ROOT: the node printed by tests/e2e/provision.sh)
# then, with the device tool: run `bash .gpu/on-device.sh` carrying .gpu (see tests/gpu/README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
node=${1:?usage: prepare.sh NODE_ROOT}
dest=$repo/.gpu
work=$(mktemp -d /tmp/c2s-gpu.XXXXXX)
trap 'umount "$node/c2s-gpu" 2>/dev/null || true; rm -rf "$work"' EXIT

# the image's files: gpucheck, a shell and the tools the launch line uses, with their libraries
root=$work/rootfs
mkdir -p "$root/bin" "$root/tmp" "$root/etc"
gcc -O2 -o "$root/gpucheck" "$here/gpucheck.c" -ldl -lm
for tool in dash sleep cat ls echo env rm mkdir chmod cp mv ln id head tail tr sed grep printf true false; do
    cp "$(type -P "$tool")" "$root/bin/"
done
ln -s dash "$root/bin/sh"
# (and what the driver's nvidia-smi and libcuda, bound in by --nv, link against)
for lib in $(ldd "$root"/bin/* "$root/gpucheck" 2>/dev/null | grep -o '/lib[^ ]*' | sort -u) \
        /lib/x86_64-linux-gnu/{libm.so.6,libdl.so.2,libpthread.so.0,librt.so.1}; do
    mkdir -p "$root$(dirname "$lib")" && cp -L "$lib" "$root$lib"
done

# compose2sif's output for the stack, and its definition with the image's source swapped
PYTHONPATH=$repo python3 -m compose2sif -f "$here/compose.yaml" convert --offline -o "$work/out" >/dev/null
def=$work/gpucheck.def
{
    printf 'Bootstrap: localimage\nFrom: /c2s-gpu/rootfs\n\n'
    printf '%%runscript\n    # as an image with CMD ["/gpucheck"] and no ENTRYPOINT: a command given replaces it\n'
    printf '    if [ "$#" -gt 0 ]; then exec "$@"; fi\n    exec /gpucheck\n\n'
    sed -n '/^%startscript/,$p' "$work/out/definitions/c2s-gpucheck-test.def"
} >"$def"
mkdir -p "$node/c2s-gpu"
mount --bind "$work" "$node/c2s-gpu"
unshare -m chroot "$node" sh -c 'mount -t proc proc /proc && mount -t tmpfs tmpfs /tmp &&
    apptainer build --force /c2s-gpu/gpucheck.sif /c2s-gpu/gpucheck.def' >"$work/build.log" 2>&1 ||
    { cat "$work/build.log"; exit 1; }
umount "$node/c2s-gpu"

# Debian's apptainer and what it needs from the node, less the C library (the machine's own is used)
bundle=$work/bundle
for f in $(chroot "$node" dpkg -L apptainer squashfuse libsquashfuse0 fuse3 libfuse3-4 squashfs-tools \
        libseccomp2 libsqlite3-0 | grep -v -E '^/usr/share|^/\.$'); do
    if [ -f "$node$f" ] || [ -L "$node$f" ]; then
        mkdir -p "$bundle$(dirname "$f")" && cp -a "$node$f" "$bundle$f"
    fi
done
for lib in $(chroot "$node" ldd /usr/bin/squashfuse /usr/bin/unsquashfs /usr/bin/fusermount3 |
        grep -o '/[^ ]*\.so[^ ]*' | sort -u); do
    case "$lib" in */libc.so.*|*/libm.so.*|*/ld-linux*) continue ;; esac
    [ -e "$bundle$lib" ] || { mkdir -p "$bundle$(dirname "$lib")" && cp -L "$node$lib" "$bundle$lib"; }
done

rm -rf "$dest" && mkdir -p "$dest"
tar -C "$bundle" -cf - . | xz -9 -T2 >"$dest/apptainer-bundle.tar.xz"
cp -r "$work/out" "$dest/out"
cp "$work/gpucheck.sif" "$dest/gpucheck.sif"
cp "$here/on-device.sh" "$dest/"
grep -qx '/.gpu/' "$repo/.git/info/exclude" 2>/dev/null || echo /.gpu/ >>"$repo/.git/info/exclude"
du -sh "$dest"

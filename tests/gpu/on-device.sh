#!/bin/bash
# The GPU check, on a lent GPU machine (root, no network), from the repository root with .gpu/ made by
# tests/gpu/prepare.sh: installs Debian's apptainer from the bundle (only files the machine lacks),
# then runs compose2sif's generated run.sh for tests/gpu/compose.yaml as an unprivileged user:
# build (the SIF put in place is used as given), up -d with its healthcheck, ps, logs, exec, down.
set -u
G=$PWD/.gpu
step() { echo; echo "=== $* ($(date +%T))"; }
step install apptainer
mkdir -p /tmp/b && tar -xJf "$G/apptainer-bundle.tar.xz" -C /tmp/b
(cd /tmp/b && find . ! -type d | while read -r f; do
    d=/${f#./}
    [ -e "$d" ] || [ -L "$d" ] || { mkdir -p "$(dirname "$d")"; cp -a "$f" "$d"; }
done)
chmod 0666 /dev/fuse  # as on a usual distribution (the lent machine has it 0600)
mkdir -p /var/lib/apptainer/mnt/session /var/lib/apptainer/mnt/source
echo /usr/local/nvidia/lib64 >/etc/ld.so.conf.d/zz-nvidia.conf && ldconfig
# the driver's own nvidia-smi first: /usr/bin/nvidia-smi there is a wrapper script that --nv would bind
export PATH=/usr/local/nvidia/bin:$PATH
apptainer --version
id hpc >/dev/null 2>&1 || useradd -m -s /bin/bash hpc
rm -rf /home/hpc/out && cp -r "$G/out" /home/hpc/out && cp "$G/gpucheck.sif" /home/hpc/out/sif/c2s-gpucheck-test.sif
chown -R hpc: /home/hpc
step compose2sif run.sh as an unprivileged user
# shellcheck disable=SC2016  # expanded by the user's shell
su - hpc -c 'export PATH=/usr/local/nvidia/bin:$PATH; cd ~ && set -x && out/run.sh build && time out/run.sh up -d &&
    out/run.sh ps && sleep 2 && out/run.sh logs cuda &&
    out/run.sh exec cuda nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv &&
    out/run.sh exec cuda sh -c "echo exec sees CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES" &&
    out/run.sh exec cuda /gpucheck && time out/run.sh down && out/run.sh ps && apptainer instance list'
echo "rc=$?"
step the machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

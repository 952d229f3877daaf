# ---- run/lib/build.sh: building the project's images into SIFs, and refreshing pulled ones ----

# The docker reference a definition starts from, when that is a tag rather than a digest.
registry_tag() {
    local line boot="" from=""
    while IFS= read -r line; do
        case "$line" in
            Bootstrap:*) boot=${line#Bootstrap:} boot=${boot// /} ;;
            From:*) from=${line#From:} from=${from// /} ;;
            %*) break ;;
        esac
    done <"$1"
    [ "$boot" = docker ] && [ -n "$from" ] && [ "${from#*@}" = "$from" ] || return 1
    printf '%s' "$from"
}

# Whether registry host $1 is a mirror that speaks plain HTTP (--registry-mirror http://HOST).
plain_registry() {
    local host
    for host in "${PLAIN_REGISTRIES[@]}"; do [ "$host" = "$1" ] && return 0; done
    return 1
}

# Whether definition $1 pulls from a plain-HTTP mirror: any stage's `From:` on one of them.
pulls_plain() {
    local line from
    [ "${#PLAIN_REGISTRIES[@]}" -gt 0 ] || return 1
    while IFS= read -r line; do
        case "$line" in
            From:*) from=${line#From:} from=${from// /}
                [ "${from#*/}" != "$from" ] && plain_registry "${from%%/*}" && return 0 ;;
        esac
    done <"$1"
    return 1
}

# The registry's digest of the tag $1 (Docker Registry HTTP API v2, one HEAD request, anonymous
# token auth as Docker Hub uses; HEAD requests do not count against its pull limit). Empty when
# it cannot be read: no curl, no network, a private registry.
tag_digest() {
    local ref=$1 registry=registry-1.docker.io name tag=latest scheme=https url headers challenge realm service scope token
    local accept="application/vnd.oci.image.index.v1+json,application/vnd.docker.distribution.manifest.list.v2+json,application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json"
    command -v curl >/dev/null 2>&1 || return 0
    name=$ref
    case "${ref%%/*}" in
        *.* | *:* | localhost) [ "${ref#*/}" != "$ref" ] && registry=${ref%%/*} name=${ref#*/} ;;
    esac
    case "$registry" in docker.io | index.docker.io) registry="registry-1.docker.io" ;; esac
    case "${name##*/}" in *:*) tag=${name##*:} name=${name%:*} ;; esac
    [ "$registry" = registry-1.docker.io ] && [ "${name#*/}" = "$name" ] && name="library/$name"
    case "$registry" in 127.* | localhost*) scheme=http ;; esac
    plain_registry "$registry" && scheme=http
    [ -n "${APPTAINER_NOHTTPS:-}${SINGULARITY_NOHTTPS:-}" ] && scheme=http
    url="$scheme://$registry/v2/$name/manifests/$tag"
    headers=$(curl -sSI --connect-timeout 5 --max-time 20 -H "Accept: $accept" -- "$url" 2>/dev/null | tr -d '\r')
    challenge=$(printf '%s\n' "$headers" | sed -n 's/^[Ww][Ww][Ww]-[Aa]uthenticate: *Bearer //p')
    if [ -n "$challenge" ]; then
        realm=$(printf '%s' "$challenge" | sed -n 's/.*realm="\([^"]*\)".*/\1/p')
        service=$(printf '%s' "$challenge" | sed -n 's/.*service="\([^"]*\)".*/\1/p')
        scope=$(printf '%s' "$challenge" | sed -n 's/.*scope="\([^"]*\)".*/\1/p')
        token=$(curl -sS --connect-timeout 5 --max-time 20 -G --data-urlencode "service=$service" \
            --data-urlencode "scope=${scope:-repository:$name:pull}" -- "$realm" 2>/dev/null |
            sed -n 's/.*"\(access_\)\{0,1\}token" *: *"\([^"]*\)".*/\2/p' | head -n 1)
        [ -n "$token" ] || return 0
        headers=$(curl -sSI --connect-timeout 5 --max-time 20 -H "Accept: $accept" -H "Authorization: Bearer $token" \
            -- "$url" 2>/dev/null | tr -d '\r')
    fi
    printf '%s\n' "$headers" | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: *\(sha256:[0-9a-f]*\)$/\1/p' | head -n 1
}

# Wait for background build $1, redrawing the block meanwhile; its exit status.
wait_build() {
    if [ "$LIVE" = 1 ]; then
        while kill -0 "$1" 2>/dev/null; do draw_builds; nap 0.5; done
    fi
    wait "$1"
}

# Build image $1 unless its SIF is up to date or in the shared cache. With $2=1 (--pull), an image
# from a registry tag is checked against the registry: a tag that moved is built again.
build_one() {
    local key=$1 pull=${2:-0} def="$HERE/definitions/$1.def" sif="$HERE/sif/$1.sif" digest log cached flags=()
    local force=${C2S_FORCE_BUILD:-0} ref want="" source
    # An image built FROM another image of the project is out of date when that one changed: its
    # digest covers the base's digest and the registry digest the base was pulled at.
    image_digest "$key"
    digest=$DIGEST
    cached="$SIF_CACHE/$digest.sif"
    if [ "$pull" = 1 ] && ref=$(registry_tag "$def"); then
        build_state "$key" "checking $ref"
        want=$(tag_digest "$ref")
        if [ -z "$want" ]; then
            force=1
            build_state "$key" "cannot read the digest of $ref from its registry: building it again"
        else
            want="$ref@$want"
        fi
    fi
    if sif_dropped "$key" && [ "$force" != 1 ] && [ "$pull" != 1 ]; then
        build_state "$key" "used as given (a SIF put in place, not built here: build --force replaces it)"
        return 0
    fi
    if [ -f "$sif" ] && [ "$(cat "$sif.digest" 2>/dev/null)" = "$digest" ] && [ "$force" != 1 ] &&
        { [ -z "$want" ] || { first_line "$sif.source" && [ "$FIRST_LINE" = "$want" ]; }; }; then
        build_state "$key" "up to date"
        return 0
    fi
    if [ -f "$cached" ] && [ "$force" != 1 ] && { [ -z "$want" ] || { first_line "$cached.source" && [ "$FIRST_LINE" = "$want" ]; }; }; then
        link_sif "$cached" "$sif" "$digest"
        build_state "$key" "taken from $SIF_CACHE"
        return 0
    fi
    source=$(registry_source "$key") || source=$def
    if grep -q '^%post' "$def" && [ "$EUID" != 0 ]; then
        flags+=(--fakeroot)
    fi
    pulls_plain "$def" && flags+=(--nohttps)
    log="$STATE/logs/build-$key.log"
    if [ -n "$want" ] && [ -f "$sif.source" ]; then
        first_line "$sif.source"
        build_state "$key" "$ref moved: $FIRST_LINE -> ${want##*@}"
    elif [ -n "$want" ]; then
        build_state "$key" "$ref: no digest kept from an earlier pull: building it again"
    elif ref=$(registry_tag "$def"); then
        # the digest the tag names now, kept with the SIF, so that a later `pull` rebuilds only where it
        # moved (read before the build: a tag moved meanwhile is seen as moved then, never missed)
        want=$(tag_digest "$ref")
        [ -n "$want" ] && want="$ref@$want"
    fi
    build_state "$key" "building${flags[*]:+ ${flags[*]}}"
    if ! (umask 077 && mkdir -p "$SIF_CACHE" "$BUILD_CACHE" "$BUILD_TMP") 2>"$log"; then
        echo "cannot create $SIF_CACHE, $BUILD_CACHE or $BUILD_TMP (set C2S_STORAGE, or C2S_SIF_CACHE and APPTAINER_CACHEDIR, to a writable place)" >>"$log"
        build_state "$key" "failed (log: $log)"
        return 1
    fi
    # in the output directory: a localimage stage's From (sif/KEY.sif) is relative to it; the SIF
    # under a name of this process's own (the build runs in a subshell: its $BASHPID is another)
    local partial="$cached.$BASHPID.tmp"
    if (cd "$HERE" && exec env "${BUILD_ENV[@]}" "$RT" build --force "${flags[@]}" "$partial" "$source") >"$log" 2>&1 &&
        mv -f "$partial" "$cached"; then
        if [ -n "$want" ]; then write_lines "$cached.source" "$want"; else rm -f "$cached.source"; fi
        link_sif "$cached" "$sif" "$digest"
        build_state "$key" "built"
    else
        rm -f "$partial"
        build_state "$key" "failed (log: $log)"
        return 1
    fi
}

# The runtime's source for image $1 when its definition is only a registry image and the shared
# start script (no %post, no other section or header): docker://REF, built without a definition
# file, so without fakeroot, in every mode; the start script is bound in at start
# (start_script_flags). Curated and Dockerfile images keep their definitions.
registry_source() {
    local line boot="" from="" section=""
    while IFS= read -r line; do
        case "$line" in
            "" | \#*) ;;
            %startscript) section=startscript ;;
            %*) return 1 ;;
            *)
                if [ -n "$section" ]; then continue; fi
                case "$line" in
                    Bootstrap:*) boot=${line#Bootstrap:} boot=${boot// /} ;;
                    From:*) from=${line#From:} from=${from// /} ;;
                    *) return 1 ;;
                esac
                ;;
        esac
    done <"$HERE/definitions/$1.def"
    [ "$boot" = docker ] && [ -n "$from" ] || return 1
    printf 'docker://%s' "$from"
}

# For the loaded service, where its image comes from its registry source: its definition's
# %startscript, as the runtime writes it into an image, in RUNDIR/KEY.startscript (services of one
# image start side by side: each writes its own temporary file), bound over the image's own at start (an image built elsewhere from docker://REF has the runtime's default).
start_script_flags() {
    local key=${S_SIF##*/} line in=0 file
    key=${key%.sif}
    registry_source "$key" >/dev/null || return 0
    file="$RUNDIR/$key.startscript"
    {
        printf '#!/bin/sh\n\n'
        while IFS= read -r line; do
            if [ "$in" = 1 ]; then printf '%s\n' "$line"; elif [ "$line" = %startscript ]; then in=1; fi
        done <"$HERE/definitions/$key.def"
    } >"$file.$BASHPID" && chmod 0755 "$file.$BASHPID" && mv -f "$file.$BASHPID" "$file" || return 1
    START_FLAGS+=(--bind "$file:/.singularity.d/startscript:ro")
}

# What build_one keeps beside image $1's SIF (sif/KEY.sif.digest): the digest of its definition
# and, for an image built FROM another image of the project, of that one's digest and source; in
# DIGEST.
DIGEST=""
image_digest() {
    local base
    image_bases "$1"
    DIGEST=$({ cat "$HERE/definitions/$1.def" && for base in "${BASES_OF[@]}"; do
        cat "$HERE/sif/$base.sif.digest" && { cat "$HERE/sif/$base.sif.source" 2>/dev/null || true; }
    done; } | sha256sum)
    DIGEST=${DIGEST%% *}
}

# A SIF put at sif/KEY.sif by hand (built elsewhere and copied here): no record of ours beside it.
sif_dropped() { [ -f "$HERE/sif/$1.sif" ] && [ ! -e "$HERE/sif/$1.sif.digest" ]; }

# Whether a definition file can be built here. Unless root, Apptainer >= 1.1 builds every
# definition file with fakeroot (SingularityCE refuses a non-root build without --fakeroot), and
# fakeroot needs a user namespace: a setuid runtime on a node with user namespaces off has none.
can_fakeroot() {
    local max=0
    [ "$EUID" = 0 ] && return 0
    if command -v unshare >/dev/null 2>&1; then
        unshare --user true >/dev/null 2>&1
        return
    fi
    { read -r max || true; } 2>/dev/null </proc/sys/user/max_user_namespaces
    [ "${max:-0}" -gt 0 ]
}

# Before anything is built or started: the images among $2... that would have to be built here from
# a definition file
# (no SIF that is up to date, in the shared SIF cache or put in place by hand; every one with $1=1:
# build --force, or up's images that have no SIF) where no definition file can be built end run.sh
# in one line, with the ways out.
refuse_unbuildable() {
    local force=$1 key digest blocked=() what
    shift
    can_fakeroot && return 0
    for key in "$@"; do
        registry_source "$key" >/dev/null && continue  # (no definition file to build)
        if [ "$force" != 1 ]; then
            sif_dropped "$key" && continue
            image_digest "$key" 2>/dev/null
            digest=$DIGEST
            [ -f "$HERE/sif/$key.sif" ] && first_line "$HERE/sif/$key.sif.digest" && [ "$FIRST_LINE" = "$digest" ] && continue
            [ -n "$SIF_CACHE" ] && [ -f "$SIF_CACHE/$digest.sif" ] && continue
        fi
        blocked+=("$key")
    done
    [ ${#blocked[@]} -gt 0 ] || return 0
    runtime_mode
    if [ ${#blocked[@]} -eq 1 ]; then
        what="image ${blocked[0]} cannot be built here: its definition needs fakeroot ($RT_MODE $RT, no user namespaces);"
        what+=" build it where user namespaces or root exist (run.sh build there) and copy it to $HERE/sif/${blocked[0]}.sif"
    else
        what=$(printf '%s, ' "${blocked[@]}")
        what="images ${what%, } cannot be built here: their definitions need fakeroot ($RT_MODE $RT, no user namespaces);"
        what+=" build them where user namespaces or root exist (run.sh build there) and copy each to $HERE/sif/KEY.sif"
    fi
    die "$what, or use --remote where the site has a build service"
}

# `up` starts services $@ (with what they depend on) from the SIFs there are, and builds none: one
# missing where it could not be built ends run.sh before anything starts (else start_service says
# to build it).
refuse_missing_images() {
    local name key missing=()
    while IFS= read -r name; do
        load_service "$name"
        key=${S_SIF##*/} key=${key%.sif}
        [ -f "$S_SIF" ] || [[ " ${missing[*]} " == *" $key "* ]] || missing+=("$key")
    done < <(closure "$@")
    [ ${#missing[@]} -eq 0 ] || refuse_unbuildable 1 "${missing[@]}"
}

# The output directory's SIF is the cache's file: a hard link where both are on one filesystem,
# else a symbolic link (never a copy: it would put the image in the home quota again).
link_sif() {
    rm -f "$2" "$2.digest" "$2.source"  # replaced, never written through
    ln "$1" "$2" 2>/dev/null || ln -s "$1" "$2" || return 1
    write_lines "$2.digest" "$3"
    if [ -f "$1.source" ]; then cp -f "$1.source" "$2.source"; else rm -f "$2.source"; fi
}

# The images of this project that image $1 starts from, in BASES_OF: the planner writes a FROM
# of an image another service builds as a `Bootstrap: localimage` stage From sif/KEY.sif.
BASES_OF=()
image_bases() {
    local line boot="" from
    BASES_OF=()
    while IFS= read -r line; do
        case "$line" in
            Bootstrap:*) boot=${line#Bootstrap:} boot=${boot// /} ;;
            From:*)
                from=${line#From:} from=${from// /}
                case "$boot:$from" in localimage:sif/*.sif) from=${from#sif/} && BASES_OF+=("${from%.sif}") ;; esac ;;
        esac
    done <"$HERE/definitions/$1.def"
}

# Build images $3... at most $2 at a time; those that fail are tried again one at a time, and
# added to BUILD_FAILED (and BUILD_LOGS, whose logs build_images shows) when that fails too.
BUILD_FAILED=() BUILD_LOGS=()
build_round() {
    local pull=$1 jobs=$2 pids=() keys=() retry=() i key pid
    shift 2
    for key in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do draw_builds; nap 0.3; done
        build_one "$key" "$pull" &
        pids+=($!) keys+=("$key")
    done
    for i in "${!pids[@]}"; do wait_build "${pids[i]}" || retry+=("${keys[i]}"); done
    # Parallel builds can trip over each other in the runtime's layer cache: retry one at a time.
    for key in "${retry[@]}"; do
        build_state "$key" "build failed; retrying alone"
        build_one "$key" "$pull" &
        pid=$!
        wait_build "$pid" || BUILD_FAILED+=("$key") BUILD_LOGS+=("$key")
    done
}

# Images that start from another image of the project are built after it, in rounds; one whose
# base failed is not built, and says so.
build_images() {
    local pull=$1 jobs=${C2S_BUILD_JOBS:-2} todo=() round=() later=() key base blocked waiting
    shift
    BUILD_FAILED=() BUILD_LOGS=()
    detect_runtime --images-only
    prepare_state
    make_dirs "$HERE/sif"
    choose_storage
    if [ -t 2 ] && [ "${TERM:-dumb}" != dumb ]; then
        LIVE=1 BUILD_KEYS=("$@")
        for key in "$@"; do remove_files "$RUNDIR/build-$key.state"; done
    fi
    refuse_unbuildable "${C2S_FORCE_BUILD:-0}" "$@"
    todo=("$@")
    while [ ${#todo[@]} -gt 0 ]; do
        round=() later=()
        for key in "${todo[@]}"; do
            image_bases "$key"
            blocked="" waiting=""
            for base in "${BASES_OF[@]}"; do
                [[ " ${BUILD_FAILED[*]} " == *" $base "* ]] && blocked=$base
                [[ " ${todo[*]} " == *" $base "* ]] && waiting=1
            done
            if [ -n "$blocked" ]; then
                build_state "$key" "not built: it starts from image $blocked, which failed"
                BUILD_FAILED+=("$key")
            elif [ -n "$waiting" ]; then
                later+=("$key")
            else
                round+=("$key")
            fi
        done
        [ ${#round[@]} -gt 0 ] || [ ${#later[@]} -eq 0 ] ||
            die "images ${later[*]} start from each other (definitions/*.def); run compose2sif convert again"
        [ ${#round[@]} -eq 0 ] || build_round "$pull" "$jobs" "${round[@]}"
        todo=("${later[@]}")
    done
    draw_builds
    for key in "${BUILD_LOGS[@]}"; do
        echo "run.sh: building image $key failed; last lines of $STATE/logs/build-$key.log:" >&2
        tail -n 20 "$STATE/logs/build-$key.log" >&2
    done
    [ ${#BUILD_FAILED[@]} -eq 0 ]
}

# ---- run/lib/storage.sh: where SIFs and build caches go ------------------------------------------

# Off $HOME, whose quota HPC sites keep small (a vLLM SIF is 10-20 GB). In this order: what the
# user set (C2S_STORAGE for all of it; C2S_SIF_CACHE, APPTAINER_CACHEDIR, APPTAINER_TMPDIR each),
# else the first writable of these outside $HOME: $SCRATCH, $WORK (set by many Slurm sites),
# /scratch/$USER, /work/$USER, /work/GROUP/$USER (Wisteria and other PJM sites), /data/GROUP/$USER
# (Fugaku's data area, where the user made one), else this output directory. The choice is made
# once (at the first build, or by `compose2sif doctor`) and kept in $STATE/storage; a copy of the
# output directory on another machine chooses again. SIFs are shared between projects there, by
# the sha256 of their definition.
STORAGE="" STORAGE_WHY="" SIF_CACHE="" BUILD_CACHE="" BUILD_TMP="" BUILD_ENV=()

# A directory we may keep SIFs in: writable, and not in the home directory.
storage_ok() {
    local real home
    [ -d "$1" ] && [ -w "$1" ] && [ -x "$1" ] || return 1
    real=$(cd "$1" && pwd -P) && home=$(cd "${HOME:-/nonexistent}" 2>/dev/null && pwd -P)
    case "$real/" in "${home:-/nonexistent}"/*) return 1 ;; esac
    return 0
}

choose_storage() {
    local dir user=${USER:-$(id -un)} recorded
    if [ -n "${C2S_STORAGE:-}" ]; then
        STORAGE=$C2S_STORAGE STORAGE_WHY="set by C2S_STORAGE"
    else
        first_line "$STATE/storage"
        recorded=$FIRST_LINE
        if [ -n "$recorded" ] && { [ -w "$recorded" ] || [ -w "$(dirname "$recorded")" ]; }; then
            STORAGE=$recorded STORAGE_WHY="chosen at the first build, kept in $STATE/storage"
        else
            STORAGE="$HERE/cache" STORAGE_WHY="no scratch or work directory found: in the output directory"
            for dir in "${SCRATCH:-}" "${WORK:-}" "/scratch/$user" "/work/$user" /work/*/"$user" /data/*/"$user"; do
                if [ -n "$dir" ] && storage_ok "$dir"; then
                    STORAGE="$(cd "$dir" && pwd -P)/compose2sif" STORAGE_WHY="a scratch or work directory outside \$HOME"
                    break
                fi
            done
            (umask 077 && mkdir -p "$STATE" && printf '%s\n' "$STORAGE" >"$STATE/storage.$BASHPID" &&
                mv -f "$STATE/storage.$BASHPID" "$STATE/storage") || die "cannot write $STATE/storage"
            note "storage: SIFs and build caches go to $STORAGE ($STORAGE_WHY; C2S_STORAGE moves them)"
        fi
    fi
    if [ "$STORAGE" = "$HERE/cache" ] && [ -L "$STORAGE" ]; then
        die "$STORAGE is a symbolic link; compose2sif does not follow links in its output directory (remove it)"
    fi
    case "$STORAGE" in /*) ;; *) STORAGE="$PWD/$STORAGE" ;; esac  # as the user meant it: from here
    SIF_CACHE=${C2S_SIF_CACHE:-$STORAGE/sif}
    case "$SIF_CACHE" in /*) ;; *) SIF_CACHE="$PWD/$SIF_CACHE" ;; esac
    BUILD_CACHE=${APPTAINER_CACHEDIR:-${SINGULARITY_CACHEDIR:-}} BUILD_TMP=${APPTAINER_TMPDIR:-${SINGULARITY_TMPDIR:-}}
    BUILD_ENV=()
    local prefix=APPTAINER
    [ -n "$RT" ] && case "$("$RT" --version 2>/dev/null)" in apptainer*) ;; *) prefix=SINGULARITY ;; esac
    if [ -z "$BUILD_CACHE" ]; then
        BUILD_CACHE="$STORAGE/cache"
        BUILD_ENV+=("${prefix}_CACHEDIR=$BUILD_CACHE")
    fi
    # Builds with --fakeroot and /etc/subuid can fail on network file systems (files owned by
    # subordinate ids, root squash): the build space moves there only on a local disk, else it
    # stays at the runtime's default ($TMPDIR or /tmp).
    if [ -z "$BUILD_TMP" ]; then
        (umask 077 && mkdir -p "$STORAGE") 2>/dev/null
        case "$(stat -f -c %T "$STORAGE" 2>/dev/null)" in
            nfs* | lustre | gpfs | beegfs | cifs | smb* | fuse* | ceph | UNKNOWN*) BUILD_TMP=${TMPDIR:-/tmp} ;;
            *) BUILD_TMP="$STORAGE/tmp" BUILD_ENV+=("${prefix}_TMPDIR=$BUILD_TMP") ;;
        esac
    fi
}

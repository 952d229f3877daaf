# ---- run/cmd/storage.sh: `_storage`, for `compose2sif doctor` ------------------------------------

# For `compose2sif doctor`: where SIFs, the runtime's cache and the build space go, and why.
cmd_storage() {
    choose_storage
    printf 'storage\t%s\t%s\n' "$STORAGE" "$STORAGE_WHY"
    printf 'SIF cache\t%s\t%s\n' "$SIF_CACHE" "$([ -n "${C2S_SIF_CACHE:-}" ] && echo "set by C2S_SIF_CACHE")"
    printf 'build cache\t%s\t%s\n' "$BUILD_CACHE" "$([ -n "${APPTAINER_CACHEDIR:-}${SINGULARITY_CACHEDIR:-}" ] && echo "set by APPTAINER_CACHEDIR")"
    printf 'build tmp\t%s\t%s\n' "$BUILD_TMP" "$([ -n "${APPTAINER_TMPDIR:-}${SINGULARITY_TMPDIR:-}" ] && echo "set by APPTAINER_TMPDIR")"
}

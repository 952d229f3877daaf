# ---- run/cmd/pull.sh: `pull [SERVICE...]` --------------------------------------------------------

# As `docker compose pull [SERVICE...]`: the images of services that run an image from a registry
# (not a build) are fetched again where their tag moved.
cmd_pull() {
    local keys=() name key
    case "${1:-}" in -*) die "pull: unknown option $1 (usage: pull [SERVICE...])" ;; esac
    if [ $# -eq 0 ]; then
        keys=("${PULLED[@]}")
    fi
    expand_replicas "$@"
    for name in "${EXPANDED[@]}"; do
        load_service "$name"
        key=${S_SIF##*/} key=${key%.sif}
        if [[ " ${PULLED[*]} " == *" $key "* ]]; then
            [[ " ${keys[*]} " == *" $key "* ]] || keys+=("$key")
        else
            note "pull: $name is built, not pulled (build --pull refreshes the base image of a build)"
        fi
    done
    if [ ${#keys[@]} -eq 0 ]; then
        note "pull: no image to pull${*:+ for $*} (build --pull refreshes the base images of builds)"
        return 0
    fi
    take_project_lock pull
    build_images 1 "${keys[@]}"
}

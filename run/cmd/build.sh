# ---- run/cmd/build.sh: `build [--pull] [--force]` ------------------------------------------------

# --force builds every image again, a SIF put in place by hand included.
cmd_build() {
    local pull=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --pull) pull=1 ;;
            --force) export C2S_FORCE_BUILD=1 ;;
            *) die "build: unknown argument $1 (usage: build [--pull] [--force])" ;;
        esac
        shift
    done
    take_project_lock build
    build_images "$pull" "${IMAGES[@]}"
}

# ---- run/cmd/build.sh: `build [--pull]` ----------------------------------------------------------

cmd_build() {
    local pull=0
    case "${1:-}" in --pull) pull=1 && shift ;; esac
    [ $# -eq 0 ] || die "build: unknown argument $1 (usage: build [--pull])"
    take_project_lock build
    build_images "$pull" "${IMAGES[@]}"
}

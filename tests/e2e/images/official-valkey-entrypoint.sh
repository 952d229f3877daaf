#!/bin/sh
# A LOOK-ALIKE of the valkey/valkey image's docker-entrypoint.sh: a first argument that is an
# option or a config file (`-...`, `*.conf`) is valkey-server's. As root it would drop to the
# valkey user; under Apptainer it runs as the caller.
set -e
case "${1:-}" in -* | *.conf) set -- valkey-server "$@" ;; esac
exec "$@"

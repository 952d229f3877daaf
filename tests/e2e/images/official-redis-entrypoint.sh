#!/bin/sh
# A LOOK-ALIKE of the official redis image's docker-entrypoint.sh: a first argument that is an
# option or a config file (`-...`, `*.conf`) is redis-server's (`command: /etc/redis.conf`).
# As root it would drop to the redis user; under Apptainer it runs as the caller.
set -e
case "${1:-}" in -* | *.conf) set -- redis-server "$@" ;; esac
exec "$@"

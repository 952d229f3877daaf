#!/bin/bash
# Like the official postgres image's entrypoint: on an empty $PGDATA, initdb with
# $POSTGRES_USER/$POSTGRES_PASSWORD, create $POSTGRES_DB, then exec postgres.
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
export PATH="$bin:$PATH"
if [ "${1:-}" = postgres ]; then
    shift
    : "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
    mkdir -p "$PGDATA" && chmod 0700 "$PGDATA"
    if [ ! -s "$PGDATA/PG_VERSION" ]; then
        pwfile=$(mktemp)
        printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}" >"$pwfile"
        initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" --auth=scram-sha-256 >/dev/null
        rm -f "$pwfile"
        pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=/tmp" -w start >/dev/null
        if [ "$POSTGRES_DB" != postgres ]; then
            PGPASSWORD=$POSTGRES_PASSWORD psql -h /tmp -U "$POSTGRES_USER" -d postgres -v ON_ERROR_STOP=1 \
                -qc "CREATE DATABASE \"$POSTGRES_DB\""
        fi
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    exec postgres "$@"
fi
exec "$@"

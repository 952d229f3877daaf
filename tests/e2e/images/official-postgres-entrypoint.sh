#!/usr/bin/env bash
# A LOOK-ALIKE of the official postgres image's docker-entrypoint.sh, for what projects rely on:
# on an empty $PGDATA, initdb with POSTGRES_USER / POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE),
# POSTGRES_INITDB_ARGS and POSTGRES_HOST_AUTH_METHOD; create POSTGRES_DB; run
# /docker-entrypoint-initdb.d/* (*.sh sourced, or run where executable; *.sql and *.sql.gz through
# psql) against a server that listens on no TCP address; then exec postgres. A first argument that
# starts with `-` is postgres's. As root it would drop to the postgres user; under Apptainer it
# runs as the caller, as the official image does under `--user`.
set -Eeo pipefail
if [ "${1:0:1}" = - ]; then set -- postgres "$@"; fi
if [ "$1" != postgres ]; then exec "$@"; fi
if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(<"$POSTGRES_PASSWORD_FILE"); fi
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"
export POSTGRES_USER POSTGRES_DB  # (as the official file_env exports them: initdb scripts read them)
mkdir -p "$PGDATA"
chmod 0700 "$PGDATA" 2>/dev/null || true
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != trust ]; then
        echo "Error: Database is uninitialized and superuser password is not specified." >&2
        echo "       You must specify POSTGRES_PASSWORD to a non-empty value for the superuser." >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS is words, as the official script splits it
    initdb -D "$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" ${POSTGRES_INITDB_ARGS:-}
    rm -f "$pwfile"
    printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
    printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.auto.conf"
    sock=$(mktemp -d)
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=$sock" -w start
    export PGHOST=$sock PGUSER=$POSTGRES_USER PGPASSWORD=${POSTGRES_PASSWORD:-}
    psql=(psql -v ON_ERROR_STOP=1 --no-password --no-psqlrc)
    if [ "$POSTGRES_DB" != postgres ]; then
        "${psql[@]}" --dbname postgres --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db" ;'
    fi
    # shellcheck disable=SC1090  # the project's own scripts
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh) if [ -x "$f" ]; then echo "running $f"; "$f"; else echo "sourcing $f"; . "$f"; fi ;;
            *.sql) echo "running $f"; "${psql[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
            *.sql.gz) echo "running $f"; gunzip -c "$f" | "${psql[@]}" --dbname "$POSTGRES_DB" ;;
            *) [ -e "$f" ] && echo "ignoring $f" ;;
        esac
    done
    unset PGHOST PGUSER PGPASSWORD
    pg_ctl -D "$PGDATA" -m fast -w stop
    rmdir "$sock" 2>/dev/null || true
    echo "PostgreSQL init process complete; ready for start up."
fi
exec postgres "${@:2}"

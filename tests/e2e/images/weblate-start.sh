#!/bin/bash
# /app/bin/start of the weblate/weblate LOOK-ALIKE, written here after what WeblateOrg/docker's start
# script (@795a142b) does: check the data volume and the site domain, make (or wait for) the Django
# secret, wait for Redis and PostgreSQL (12 or newer), and for `runserver`: pick the supervisor
# programs (WEBLATE_SERVICE names one; empty: all), migrate and create the admin where this
# container runs the migrations (WEBLATE_SERVICE empty or celery-beat), collect the static files,
# write nginx's site into /tmp/nginx and exec supervisord. Any other command runs as `weblate CMD`.
set -e
. /app/venv/bin/activate
export WEBLATE_CMD=/app/venv/bin/weblate WEBLATE_PY_PATH=/app/data/python/customize
run_weblate() { "$WEBLATE_CMD" "$@"; }
runs_migrations() { [ -z "${WEBLATE_SERVICE:-}" ] || [ "$WEBLATE_SERVICE" = celery-beat ]; }

: "${CLIENT_MAX_BODY_SIZE:=1000m}"
export CLIENT_MAX_BODY_SIZE
echo "Starting Weblate $WEBLATE_VERSION..."
if [ ! -w /app/data ]; then
    echo "The /app/data volume is not writable, please adjust the permissions. Weblate is running as uid $(id -u)"
    exit 1
fi
if runs_migrations; then
    if [ ! -s /app/data/secret ]; then
        echo "Generating Django secret..."
        (umask 077 && python -c "from django.utils.crypto import get_random_string; print(get_random_string(50))" \
            >/app/data/secret.new && mv -f /app/data/secret.new /app/data/secret)
    fi
else
    for _ in $(seq 30); do [ -s /app/data/secret ] && break; sleep 1; done
    [ -s /app/data/secret ] || { echo "Django secret was not created by the migration service within 30 seconds." >&2; exit 1; }
fi
if [ -z "$WEBLATE_SITE_DOMAIN" ]; then
    echo "Missing WEBLATE_SITE_DOMAIN, please configure it"
    exit 1
fi
: "${POSTGRES_SSL_MODE:=prefer}"
export POSTGRES_SSL_MODE PGPASSWORD="$POSTGRES_PASSWORD" PGSSLMODE="$POSTGRES_SSL_MODE"
zone="/usr/share/zoneinfo/${WEBLATE_TIME_ZONE:-Etc/UTC}"
[ -f "$zone" ] || zone=/usr/share/zoneinfo/Etc/UTC
if [ -w /tmp ]; then cat "$zone" >/tmp/localtime; fi
if [ ! -d "$WEBLATE_PY_PATH" ]; then
    mkdir -p "$WEBLATE_PY_PATH/static"
    touch "$WEBLATE_PY_PATH/__init__.py" "$WEBLATE_PY_PATH/models.py"
fi
run_weblate check || { echo "Failed to load configuration, please see errors above." >&2; exit 1; }

wait_for() {  # LABEL PYTHON: what `weblate shell` runs until it succeeds, 30 tries
    for try in $(seq 30); do
        run_weblate shell -c "$2" >/dev/null && return 0
        echo "$1 is unavailable - retrying $((30 - try))" >&2
        sleep 1
    done
    run_weblate shell -c "$2"
    echo "$1 not running!" >&2
    exit 1
}
wait_for redis 'from django.core.cache import cache; cache.get("ping")'
: "${POSTGRES_HOST:=database}"
export POSTGRES_HOST
wait_for PostgreSQL 'from django.db import connection; connection.ensure_connection()'
version=$(psql -h "$POSTGRES_HOST" ${POSTGRES_PORT:+-p "$POSTGRES_PORT"} -d "${POSTGRES_DB:-$POSTGRES_DATABASE}" \
    -U "$POSTGRES_USER" -t -A -c 'SHOW server_version_num;')
echo "Postgres $version is up" >&2
if [ "$version" -lt 120000 ]; then
    echo "PostgreSQL 12 or newer is required to run Weblate" >&2
    exit 1
fi
unset PGPASSWORD

if [ "${1:-}" = runserver ]; then
    mkdir -p /run/supervisor.conf.d
    rm -f /run/supervisor.conf.d/*
    if [ -n "${WEBLATE_SERVICE:-}" ]; then
        ln -s "/etc/supervisor/conf.d/$WEBLATE_SERVICE.conf" /run/supervisor.conf.d/
    else
        for program in /etc/supervisor/conf.d/*.conf; do
            [ "$program" = /etc/supervisor/conf.d/celery-single.conf ] || ln -s "$program" /run/supervisor.conf.d/
        done
    fi
    if runs_migrations; then
        echo "Starting database migration..."
        run_weblate migrate
        if [ -n "$WEBLATE_ADMIN_PASSWORD" ]; then
            echo "Updating admin user password (unset WEBLATE_ADMIN_PASSWORD to disable)..."
            run_weblate createadmin --password="$WEBLATE_ADMIN_PASSWORD" --update --email="$WEBLATE_ADMIN_EMAIL" \
                --name="$WEBLATE_ADMIN_NAME"
        else
            run_weblate createadmin --email="$WEBLATE_ADMIN_EMAIL" --name="$WEBLATE_ADMIN_NAME" || true
        fi
        echo "Refreshing stats..."
        run_weblate ensure_stats
    fi
    run_weblate collectstatic --noinput
    mkdir -p /run/granian /run/celery /tmp/nginx
    rm -f /run/granian/granian.sock /run/celery/beat.pid
    export GRANIAN_SOCKET=/run/granian/granian.sock
    sed -e "s#@GRANIAN_SOCKET@#$GRANIAN_SOCKET#g" -e "s#@CLIENT_MAX_BODY_SIZE@#$CLIENT_MAX_BODY_SIZE#g" \
        /etc/nginx/weblate-site.tpl >/tmp/nginx/weblate-site.conf
    if [ -z "${WEBLATE_WORKERS:-}" ]; then
        WEBLATE_WORKERS=$(nproc)
        [ "$WEBLATE_WORKERS" -ge 2 ] || WEBLATE_WORKERS=2
        [ "$WEBLATE_WORKERS" -le 4 ] || WEBLATE_WORKERS=4
        echo "Auto-scaled to $WEBLATE_WORKERS processes, adjust by setting WEBLATE_WORKERS"
    fi
    half=$(((WEBLATE_WORKERS + 1) / 2))
    export CELERY_MAIN_OPTIONS="${CELERY_MAIN_OPTIONS:---concurrency $half}"
    export CELERY_NOTIFY_OPTIONS="${CELERY_NOTIFY_OPTIONS:---concurrency $WEBLATE_WORKERS}"
    export CELERY_TRANSLATE_OPTIONS="${CELERY_TRANSLATE_OPTIONS:---concurrency $half}"
    export CELERY_MEMORY_OPTIONS="${CELERY_MEMORY_OPTIONS:---concurrency 1}"
    export CELERY_BACKUP_OPTIONS="${CELERY_BACKUP_OPTIONS:---concurrency 1}"
    export CELERY_BEAT_OPTIONS="${CELERY_BEAT_OPTIONS:-}"
    export CELERY_SINGLE_OPTIONS="${CELERY_SINGLE_OPTIONS:-}"
    export WEB_WORKERS="${WEB_WORKERS:-$((WEBLATE_WORKERS <= 3 ? 2 : WEBLATE_WORKERS / 2))}"
    export WEB_BLOCKING_THREADS="${WEB_BLOCKING_THREADS:-$((WEBLATE_WORKERS * 2))}"
    export GRANIAN_ARGS="${GRANIAN_ARGS:-}"
    export GRANIAN_INTERFACE=wsgi GRANIAN_APPLICATION=weblate.wsgi:application
    export GRANIAN_MODE_ARGS="--runtime-threads 2 --blocking-threads $WEB_BLOCKING_THREADS"
    exec /app/venv/bin/supervisord --loglevel="${SUPERVISOR_LOGLEVEL:-info}" --logfile="${SUPERVISOR_LOGFILE:-/dev/null}" \
        --configuration=/etc/supervisor/supervisord.conf
fi
run_weblate "$@"

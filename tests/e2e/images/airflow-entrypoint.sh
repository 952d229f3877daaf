#!/usr/bin/env bash
# /entrypoint of the apache/airflow LOOK-ALIKE, written here after what the image's
# scripts/docker/entrypoint_prod.sh (3.1.0) does, for what the docs' compose file relies on:
# - refuse a group other than 0 unless the user is airflow (50000), as upstream does;
# - wait for the metadata database (`airflow db check`, CONNECTION_CHECK_MAX_COUNT tries,
#   CONNECTION_CHECK_SLEEP_TIME apart) before the database's users (scheduler, dag-processor,
#   triggerer, api-server);
# - _AIRFLOW_DB_MIGRATE: `airflow db migrate`; _AIRFLOW_WWW_USER_CREATE: the admin user, with FAB;
#   _PIP_ADDITIONAL_REQUIREMENTS: pip install them;
# - `bash ...` and `python ...` run as they are; anything else is an airflow command
#   (`airflow` in front is dropped), and scheduler and celery wait for the Celery broker first.
AIRFLOW_COMMAND="${1:-}"
set -euo pipefail

retry() {  # CHECK...: until it succeeds, CONNECTION_CHECK_MAX_COUNT tries
    local left=$CONNECTION_CHECK_MAX_COUNT output
    while ! output=$("$@" 2>&1); do
        echo -n "."
        left=$((left - 1))
        if [ "$left" -le 0 ]; then
            echo
            echo "ERROR! Maximum number of retries ($CONNECTION_CHECK_MAX_COUNT) reached."
            echo "Last check result:"
            echo "\$ $*"
            echo "$output"
            exit 1
        fi
        sleep "$CONNECTION_CHECK_SLEEP_TIME"
    done
    echo
}

reachable() {  # URL: its host's port answers (the scheme's default port where it names none)
    python - "$1" <<'PY'
import socket, sys
from urllib.parse import urlsplit
url = urlsplit(sys.argv[1])
defaults = {"postgres": 5432, "postgresql": 5432, "mysql": 3306, "redis": 6379, "amqp": 5672, "pyamqp": 5672}
port = url.port or next((p for s, p in defaults.items() if url.scheme.startswith(s)), None)
if port is None:
    sys.exit(0)
socket.create_connection((url.hostname or "localhost", port), timeout=5).close()
PY
}

if [ "$(id -g)" != 0 ]; then
    if [ "$(id -u)" = 50000 ]; then
        echo "WARNING! You should run the image with GID (Group ID) set to 0 even if you use 'airflow' user (UID=50000)" >&2
    else
        echo "ERROR! You should run the image with GID=0" >&2
        echo " You started the image with UID=$(id -u) and GID=$(id -g)" >&2
        exit 1
    fi
fi
unset PIP_USER
umask 0002
CONNECTION_CHECK_MAX_COUNT=${CONNECTION_CHECK_MAX_COUNT:=20}
CONNECTION_CHECK_SLEEP_TIME=${CONNECTION_CHECK_SLEEP_TIME:=3}
if ! whoami >/dev/null 2>&1; then
    export HOME="$AIRFLOW_USER_HOME_DIR"
fi
if [ "$(id -u)" = 0 ]; then
    echo "The container is run as root user. For security, consider using a regular user account." >&2
fi

command_to_run=$AIRFLOW_COMMAND
[ "$command_to_run" != airflow ] || command_to_run=${2:-}
if [ "$CONNECTION_CHECK_MAX_COUNT" -gt 0 ] && [[ $command_to_run =~ ^(scheduler|dag-processor|triggerer|api-server)$ ]]; then
    retry airflow db check
fi
if [ -n "${_AIRFLOW_DB_UPGRADE:-}${_AIRFLOW_DB_MIGRATE:-}" ]; then
    airflow db migrate || true
fi
if [ -n "${_AIRFLOW_WWW_USER_CREATE:-}" ]; then
    password=${_AIRFLOW_WWW_USER_PASSWORD:-}
    if [ -n "${_AIRFLOW_WWW_USER_PASSWORD_CMD:-}" ]; then password=$(eval "$_AIRFLOW_WWW_USER_PASSWORD_CMD"); fi
    unset _AIRFLOW_WWW_USER_PASSWORD _AIRFLOW_WWW_USER_PASSWORD_CMD
    if [ -z "$password" ]; then
        echo "ERROR! Airflow Admin password not set via _AIRFLOW_WWW_USER_PASSWORD or _AIRFLOW_WWW_USER_PASSWORD_CMD variables!"
        exit 1
    fi
    if airflow config get-value core auth_manager | grep -q FabAuthManager; then
        airflow users create --username "${_AIRFLOW_WWW_USER_USERNAME:-admin}" \
            --firstname "${_AIRFLOW_WWW_USER_FIRSTNAME:-Airflow}" --lastname "${_AIRFLOW_WWW_USER_LASTNAME:-Admin}" \
            --email "${_AIRFLOW_WWW_USER_EMAIL:-airflowadmin@example.com}" --role "${_AIRFLOW_WWW_USER_ROLE:-Admin}" \
            --password "$password" || true
    else
        echo "Skipping user creation as auth manager different from Fab is used"
    fi
fi
if [ -n "${_PIP_ADDITIONAL_REQUIREMENTS:-}" ]; then
    echo "!!!!!  Installing additional requirements: '${_PIP_ADDITIONAL_REQUIREMENTS}' !!!!!!!!!!!!" >&2
    # shellcheck disable=SC2086  # a list of requirements, as upstream splits it
    pip install --root-user-action ignore ${_PIP_ADDITIONAL_REQUIREMENTS}
fi
case "$AIRFLOW_COMMAND" in
    bash) shift; exec /bin/bash "$@" ;;
    python) shift; exec python "$@" ;;
    airflow) shift ;;
esac
if [[ ${1:-} =~ ^(scheduler|celery)$ ]] && [ "$CONNECTION_CHECK_MAX_COUNT" -gt 0 ] &&
        [ "$(airflow config get-value core executor)" = CeleryExecutor ]; then
    retry reachable "$(airflow config get-value celery broker_url)"
fi
if [ "$#" -eq 0 ] && [ "${_AIRFLOW_DB_MIGRATE:-}" = true ]; then
    echo "[INFO] No commands passed and _AIRFLOW_DB_MIGRATE=true. Exiting script with code 0."
    exit 0
fi
exec airflow "$@"

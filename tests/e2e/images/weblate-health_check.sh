#!/bin/sh
# /app/bin/health_check of the weblate/weblate LOOK-ALIKE (the image's HEALTHCHECK), after
# upstream's: the web answers /healthz/ where the web program runs here, and no supervisor program
# has failed (`check` runs once and exits).
if [ -f /run/supervisor.conf.d/web.conf ]; then
    curl --silent --fail --max-time 30 http://localhost:8080/healthz/ >/dev/null || exit 1
fi
services=$(/app/venv/bin/supervisorctl status)
code=$?
if [ "$code" -ne 0 ] && [ "$code" -ne 3 ]; then
    echo "supervisorctl failed ($code)"
    exit 1
fi
failing=$(echo "$services" | grep -v '^check *EXITED\|RUNNING' || true)
if [ -n "$failing" ]; then
    echo "$failing"
    exit 1
fi

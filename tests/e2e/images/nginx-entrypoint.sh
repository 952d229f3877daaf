#!/bin/sh
# Like the official nginx image's entrypoint: render /etc/nginx/templates/*.template with envsubst
# into /etc/nginx/conf.d, skipping (with a message) when that directory is not writable.
set -e
templates=${NGINX_ENVSUBST_TEMPLATE_DIR:-/etc/nginx/templates}
out=${NGINX_ENVSUBST_OUTPUT_DIR:-/etc/nginx/conf.d}
if [ -d "$templates" ]; then
    if [ -w "$out" ]; then
        vars=$(printf '${%s} ' $(env | cut -d= -f1))
        for t in "$templates"/*.template; do
            [ -f "$t" ] || continue
            envsubst "$vars" <"$t" >"$out/$(basename "$t" .template)"
        done
    else
        echo "docker-entrypoint.sh: $out is not writable; templates not rendered" >&2
    fi
fi
exec "$@"

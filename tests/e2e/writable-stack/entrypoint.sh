#!/bin/sh
# writes where a read-only image would refuse, then serves what it wrote
set -e
mkdir -p /var/log/app
echo "started $$" >/var/log/app/started
exec python3 -m http.server --bind "$HOST" --directory /var/log/app "$PORT"

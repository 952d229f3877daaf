#!/bin/sh
# A LOOK-ALIKE of postgis/docker-postgis' initdb-postgis.sh (its /docker-entrypoint-initdb.d/10_postgis.sh):
# a template_postgis database, and PostGIS's extensions in it and in POSTGRES_DB. The entrypoint runs it
# against its socket-only server (PGHOST, PGUSER and PGPASSWORD set).
set -e
psql=${PSQL:-psql}
"$psql" -v ON_ERROR_STOP=1 --no-password --no-psqlrc --dbname postgres -c "CREATE DATABASE template_postgis IS_TEMPLATE true"
# (Debian's PostGIS has no tiger geocoder: the extensions upstream loads that this one has)
extensions=$("$psql" --no-password --no-psqlrc --dbname postgres -tAc "SELECT name FROM pg_available_extensions
    WHERE name IN ('postgis', 'postgis_topology', 'fuzzystrmatch', 'postgis_tiger_geocoder')
    ORDER BY array_position(ARRAY['postgis', 'postgis_topology', 'fuzzystrmatch', 'postgis_tiger_geocoder'], name)")
for db in template_postgis "$POSTGRES_DB"; do
    for extension in $extensions; do
        echo "loading $extension into $db"
        "$psql" -v ON_ERROR_STOP=1 --no-password --no-psqlrc --dbname "$db" -c "CREATE EXTENSION IF NOT EXISTS $extension"
    done
done

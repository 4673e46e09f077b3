#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialised (the postgres image's initdb hook): the role the
# workers log in as. It owns nothing; `harness db grant-worker` (the compose `migrate` step) gives it the
# rows a worker reads and writes, table by table, after each migration.
set -eu
: "${HARNESS_WORKER_DB_PASSWORD:?set HARNESS_WORKER_DB_PASSWORD in docker/.env}"
psql -v ON_ERROR_STOP=1 -v pw="$HARNESS_WORKER_DB_PASSWORD" --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE harness_worker LOGIN PASSWORD :'pw';
SQL

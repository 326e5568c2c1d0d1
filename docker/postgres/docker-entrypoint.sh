#!/bin/bash
# The official postgres image's entrypoint, for what docker-compose.yml uses: on an empty
# PGDATA, initdb with POSTGRES_USER (default postgres) and POSTGRES_PASSWORD (required),
# password (scram-sha-256) login from any address, then POSTGRES_DB (default the user's
# name) created in single-user mode; then the command (`postgres ARGS`, or `-c ...` alone).
set -euo pipefail
: "${PGDATA:=/var/lib/postgresql/data}"
if [ "${1:0:1}" = - ]; then set -- postgres "$@"; fi
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
  user="${POSTGRES_USER:-postgres}"
  db="${POSTGRES_DB:-$user}"
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "docker-entrypoint.sh: POSTGRES_PASSWORD is not set" >&2; exit 1; }
  pwfile="$(mktemp)"
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8
  rm -f "$pwfile"
  echo 'host all all all scram-sha-256' >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$db" != postgres ]; then
    echo "CREATE DATABASE \"$db\" OWNER \"$user\"" | postgres --single -D "$PGDATA" -c exit_on_error=true postgres >/dev/null
  fi
  echo "docker-entrypoint.sh: initialised $PGDATA (user $user, database $db)"
fi
# After a power loss postmaster.pid can come back empty or zero-filled and PostgreSQL refuses to
# start; in a fresh container no postgres runs yet, so a lock file whose PID is not a live postgres
# is stale: remove it (#29).
if [ "$1" = postgres ] && [ -f "$PGDATA/postmaster.pid" ]; then
  pid="$(head -n1 "$PGDATA/postmaster.pid" 2>/dev/null | tr -d '\0[:space:]' || true)"
  if ! { [[ "$pid" =~ ^[1-9][0-9]*$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ]; }; then
    echo "docker-entrypoint.sh: removing stale $PGDATA/postmaster.pid (PID '$pid')" >&2
    rm -f "$PGDATA/postmaster.pid"
  fi
fi
exec "$@"

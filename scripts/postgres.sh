#!/usr/bin/env bash
# Native PostgreSQL for local runs and CI (no Docker), from Debian's `postgresql` package.
#
#   scripts/postgres.sh install              apt-get install postgresql if no initdb/pg_ctl is found
#   scripts/postgres.sh start [PORT] [DIR]   initdb DIR (once), pg_ctl start on 127.0.0.1:PORT, create the
#                                            test user and database; prints BUS_POSTGRES_URL=...
#   scripts/postgres.sh stop [PORT] [DIR]    pg_ctl stop -m fast (then immediate)
#   scripts/postgres.sh kill [PORT] [DIR]    pg_ctl stop -m immediate (a crash, for fault tests)
#   scripts/postgres.sh env [PORT]           prints: export BUS_POSTGRES_URL=...
#   scripts/postgres.sh status [PORT] [DIR]  exit 0 if running and accepting connections
#
# Env: BUS_POSTGRES_PORT (5433: 5432 is left to a system server), BUS_BROKER_HOME (~/.cache/bus-brokers),
#      BUS_POSTGRES_BIN (directory holding initdb/pg_ctl), BUS_POSTGRES_USER / _PASSWORD / _DB (bus/bus/bus),
#      BUS_POSTGRES_RUN_AS (user the server runs as when this script runs as root: postgres),
#      BUS_POSTGRES_START_TIMEOUT (30 s), BUS_POSTGRES_SOCKET_DIR (the cluster's directory: where its Unix
#      socket goes; the power-cut test keeps it off its FUSE mount, which has no sockets), BUS_POSTGRES_SERVER_OPTS (more `-c name=value` for the server,
#      e.g. TLS: "-c ssl=on -c ssl_cert_file=... -c ssl_key_file=..."). Human messages go to stderr, data lines to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=postgres
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"

PG_HOST=127.0.0.1
PG_USER="${BUS_POSTGRES_USER:-bus}"
PG_PASSWORD="${BUS_POSTGRES_PASSWORD:-bus}"
PG_DB="${BUS_POSTGRES_DB:-bus}"
START_TIMEOUT="${BUS_POSTGRES_START_TIMEOUT:-30}"
RUN_AS="${BUS_POSTGRES_RUN_AS:-postgres}"

pg_port() { echo "${1:-${BUS_POSTGRES_PORT:-5433}}"; }
default_dir() { echo "$BUS_BROKER_RUN/postgres-$1"; }
url() { echo "postgres://$PG_USER:$PG_PASSWORD@$PG_HOST:$1/$PG_DB"; }

# pg_bindir: print the directory holding initdb and pg_ctl (newest Debian version wins).
pg_bindir() {
  if [ -n "${BUS_POSTGRES_BIN:-}" ]; then echo "$BUS_POSTGRES_BIN"; return 0; fi
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1 || true)"
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  d="$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"
  [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  return 1
}

cmd_install() {
  local bin
  if ! bin="$(pg_bindir)"; then
    apt_install postgresql
    # The package may start a cluster on 5432; ours run on their own port and directory.
    bin="$(pg_bindir)" || die "initdb still not found after apt-get install postgresql"
  fi
  log "using $bin"
  "$bin/postgres" --version
}

# PostgreSQL refuses to run as root: as root, run the server tools as $RUN_AS.
as_server() {
  if [ "$(id -u)" = 0 ]; then
    id "$RUN_AS" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$RUN_AS"
    runuser -u "$RUN_AS" -- "$@"
  else
    "$@"
  fi
}

# data_home PORT [DIR]: the cluster's directory. Under root the server user must be able to reach it;
# a home such as /root (mode 700) is not reachable, so the cluster then lives in /var/tmp/bus-brokers.
data_home() {
  local dir="${2:-$(default_dir "$1")}"
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$dir"
    chown "$RUN_AS" "$dir" 2>/dev/null || true
    if ! runuser -u "$RUN_AS" -- test -w "$dir" 2>/dev/null; then
      local alt="/var/tmp/bus-brokers/postgres-$1"
      [ -n "${2:-}" ] && alt="/var/tmp/bus-brokers/$(echo "$dir" | tr '/' '_')"
      mkdir -p "$alt"; chmod 755 /var/tmp/bus-brokers; chown "$RUN_AS" "$alt"
      echo "$alt"
      return 0
    fi
  fi
  mkdir -p "$dir"
  echo "$dir"
}

ready() { # ready PORT: accepting connections
  "$(pg_bindir)/pg_isready" -q -h "$PG_HOST" -p "$1" -t 2 >/dev/null 2>&1
}

psql_admin() { # psql_admin HOME PORT SQL...: as the cluster's superuser over its own socket
  local home="$1" port="$2"; shift 2
  as_server "$(pg_bindir)/psql" -X -q -v ON_ERROR_STOP=1 -h "${BUS_POSTGRES_SOCKET_DIR:-$home}" -p "$port" -U "$RUN_AS_DB" -d postgres "$@"
}

# clear_stale_pid DATA: after a power loss postmaster.pid can come back empty or zero-filled
# (written, never fsynced), and PostgreSQL then refuses to start ("lock file "postmaster.pid" is
# empty"). Remove it, as an operator would, when no postgres process owns it: empty, not a number,
# zero, or a PID that is gone or not a postgres (PIDs are reused after a reboot). (#29)
clear_stale_pid() {
  local pidfile="$1/postmaster.pid" pid
  [ -f "$pidfile" ] || return 0
  pid="$(head -n1 "$pidfile" 2>/dev/null | tr -d '\0[:space:]' || true)"
  if [[ "$pid" =~ ^[1-9][0-9]*$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ]; then
    return 0
  fi
  log "removing stale $pidfile (PID '${pid}' is not a running postgres: left by a crash or power loss)"
  rm -f "$pidfile"
}

cmd_start() {
  local port home data bin lf
  port="$(pg_port "${1:-}")"
  bin="$(pg_bindir)" || { cmd_install >/dev/null; bin="$(pg_bindir)"; }
  home="$(data_home "$port" "${2:-}")"
  data="$home/data"; lf="$home/postgres.log"
  RUN_AS_DB="$( [ "$(id -u)" = 0 ] && echo "$RUN_AS" || id -un )"

  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data"
    as_server "$bin/initdb" -D "$data" -U "$RUN_AS_DB" --auth-local=trust --auth-host=scram-sha-256 \
      -E UTF8 --locale=C.UTF-8 >"$home/initdb.log" 2>&1 || { tail_log "$home/initdb.log"; die "initdb failed"; }
  fi
  if as_server "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    log "already running (port $port, data $data)"
  else
    port_open "$PG_HOST" "$port" && die "port $port on $PG_HOST is already in use by another process"
    clear_stale_pid "$data"
    log "starting $bin/postgres on $PG_HOST:$port (data $data, log $lf)"
    # Sockets in the cluster's own directory; max_connections leaves room for the conformance suite's
    # parallel buses. fsync and synchronous_commit stay on: an ack is a durable commit.
    as_server "$bin/pg_ctl" start -D "$data" -l "$lf" -w -t "$START_TIMEOUT" -o \
      "-c listen_addresses=$PG_HOST -p $port -c unix_socket_directories=${BUS_POSTGRES_SOCKET_DIR:-$home} -c max_connections=300 ${BUS_POSTGRES_SERVER_OPTS:-}" \
      >&2 || { tail_log "$lf"; die "pg_ctl start failed"; }
  fi
  local end=$(( $(now_ms) + START_TIMEOUT * 1000 ))
  until ready "$port"; do
    [ "$(now_ms)" -ge "$end" ] && { tail_log "$lf"; die "postgres not ready after ${START_TIMEOUT}s"; }
    sleep 0.1
  done
  # Test role and database, created once (the password is reset so BUS_POSTGRES_PASSWORD changes apply).
  psql_admin "$home" "$port" <<SQL >&2
SELECT 'CREATE ROLE "$PG_USER" LOGIN' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER')\gexec
ALTER ROLE "$PG_USER" LOGIN PASSWORD '$PG_PASSWORD';
SELECT 'CREATE DATABASE "$PG_DB" OWNER "$PG_USER"' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$PG_DB')\gexec
SQL
  log "ready (port $port, data $data)"
  echo "BUS_POSTGRES_URL=$(url "$port")"
}

stop_mode() {
  local mode="$1" port home data bin
  port="$(pg_port "${2:-}")"
  bin="$(pg_bindir)" || { log "postgres not installed"; return 0; }
  home="$(data_home "$port" "${3:-}")"; data="$home/data"
  if ! as_server "$bin/pg_ctl" status -D "$data" >/dev/null 2>&1; then
    log "not running (port $port, data $data)"
    return 0
  fi
  as_server "$bin/pg_ctl" stop -D "$data" -m "$mode" -w -t "${BUS_POSTGRES_STOP_TIMEOUT:-15}" >&2 \
    || as_server "$bin/pg_ctl" stop -D "$data" -m immediate -w >&2
  log "stopped ($mode, port $port)"
}

cmd_status() {
  local port home bin
  port="$(pg_port "${1:-}")"
  if bin="$(pg_bindir)" && home="$(data_home "$port" "${2:-}")" \
     && as_server "$bin/pg_ctl" status -D "$home/data" >/dev/null 2>&1 && ready "$port"; then
    log "running: port $port, data $home/data"
    return 0
  fi
  log "not running on port $port"
  return 1
}

cmd_env() { echo "export BUS_POSTGRES_URL=$(url "$(pg_port "${1:-}")")"; }

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  install) cmd_install ;;
  start)   cmd_start "$@" ;;
  stop)    stop_mode fast "$@" ;;
  kill)    stop_mode immediate "$@" ;;
  env)     cmd_env "$@" ;;
  status)  cmd_status "$@" ;;
  *)       usage ;;
esac

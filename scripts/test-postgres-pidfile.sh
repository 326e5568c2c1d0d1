#!/usr/bin/env bash
# scripts/postgres.sh starts a cluster after a power loss (#29): a throwaway cluster on its own port
# and directory is stopped, its postmaster.pid is put back as a power cut leaves it (zero-filled,
# then empty, then naming a PID that is not a postgres), and each time `postgres.sh start` must
# bring it up. A running server's lock file is left alone (a second start says "already running").
#   scripts/test-postgres-pidfile.sh [PORT]   (default 55433; needs Debian's postgresql, installs it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUS_LOG_TAG=pg-pidfile
. scripts/lib/common.sh

port="${1:-55433}"
port_open 127.0.0.1 "$port" && die "port $port is in use"
dir="$(mktemp -d /var/tmp/bus-pg-pidfile.XXXXXX)"
chmod 755 "$dir"
cleanup() { scripts/postgres.sh stop "$port" "$dir" >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT

start() { scripts/postgres.sh start "$port" "$dir" >/dev/null; }
# The cluster's data directory (postgres.sh may move it where the server user can reach it).
data() { find "$dir" /var/tmp/bus-brokers -maxdepth 3 -name postmaster.opts -path "*$(basename "$dir")*" \
  -printf '%h\n' 2>/dev/null | head -n1; }

start
d="$(data)"; [ -n "$d" ] || die "no data directory found under $dir"
pid_before="$(head -n1 "$d/postmaster.pid")"
start   # running: its lock file must survive
[ "$(head -n1 "$d/postmaster.pid")" = "$pid_before" ] || die "a running server's postmaster.pid was touched"

for how in zero-filled empty not-a-postgres; do
  scripts/postgres.sh kill "$port" "$dir" >/dev/null
  case "$how" in
    zero-filled) head -c 96 /dev/zero >"$d/postmaster.pid" ;;
    empty) : >"$d/postmaster.pid" ;;
    not-a-postgres) printf '%s\n%s\n' "$$" "$d" >"$d/postmaster.pid" ;;  # this shell's PID
  esac
  start || die "postgres.sh start failed after a $how postmaster.pid"
  scripts/postgres.sh status "$port" "$dir" || die "not accepting connections after a $how postmaster.pid"
  log "started after a $how postmaster.pid"
done
log "ok: postgres.sh starts a cluster after a power loss (zero-filled, empty, foreign PID)"

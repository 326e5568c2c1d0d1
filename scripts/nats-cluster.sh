#!/usr/bin/env bash
# Native three-node NATS cluster (routes, JetStream on each node, sync_interval: always)
# for cluster tests and local runs (no Docker). Loopback only.
#
#   scripts/nats-cluster.sh start [BASE]         start nodes 0..2, wait for a JetStream meta leader;
#                                                prints BUS_NATS_URL=nats://..,nats://..,nats://..
#   scripts/nats-cluster.sh stop [BASE]          TERM (then KILL) every node by pidfile
#   scripts/nats-cluster.sh status [BASE]        exit 0 if all three nodes are healthy
#   scripts/nats-cluster.sh env [BASE]           prints: export BUS_NATS_URL=...
#   scripts/nats-cluster.sh kill NODE [BASE]     kill -9 node NODE (0, 1 or 2)
#   scripts/nats-cluster.sh restart NODE [BASE]  start node NODE again (same store), wait for it
#   scripts/nats-cluster.sh wipe [BASE]          stop, then delete the cluster's stores
#
# Ports of node i: client BASE+i, cluster (routes) BASE+100+i, monitor BASE+4000+i.
# Env: BUS_NATS_CLUSTER_BASE (24222), BUS_BROKER_HOME (~/.cache/bus-brokers), BUS_NATS_BIN,
#      BUS_NATS_VERSION, BUS_NATS_START_TIMEOUT (30 s), BUS_NATS_MAX_PAYLOAD (8MB).
#      Human messages go to stderr, data lines to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=nats-cluster
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"
# shellcheck source=lib/nats-install.sh
. "$SCRIPT_DIR/lib/nats-install.sh"
# shellcheck source=lib/cluster.sh
. "$SCRIPT_DIR/lib/cluster.sh"

NATS_HOST=127.0.0.1
START_TIMEOUT="${BUS_NATS_START_TIMEOUT:-30}"
MAX_PAYLOAD="${BUS_NATS_MAX_PAYLOAD:-8MB}"
NODES=(0 1 2)
CLUSTER_PROC=nats-server
CLUSTER_STOP_TIMEOUT="${BUS_NATS_STOP_TIMEOUT:-15}"

base() { echo "${1:-${BUS_NATS_CLUSTER_BASE:-24222}}"; }
client_port() { echo $(( $1 + $2 )); }          # client_port BASE NODE
route_port() { echo $(( $1 + 100 + $2 )); }
monitor_port() { echo $(( $1 + 4000 + $2 )); }
nodedir() { echo "$(cluster_dir "$1")/n$2"; }
pidfile() { echo "$(nodedir "$1" "$2").pid"; }
logfile() { echo "$(nodedir "$1" "$2").log"; }

urls() { # urls BASE: the three client URLs, comma-separated
  local b="$1" out="" i
  for i in "${NODES[@]}"; do out="$out${out:+,}nats://$NATS_HOST:$(client_port "$b" "$i")"; done
  echo "$out"
}

# write_conf BASE NODE: one node's config. sync_interval always: JetStream fsyncs
# before each ack; routes to all three (a node ignores its own route).
write_conf() {
  local b="$1" n="$2" d conf routes="" i
  d="$(nodedir "$b" "$n")"; conf="$d.conf"
  for i in "${NODES[@]}"; do
    [ "$i" = "$n" ] && continue
    routes="$routes    nats-route://$NATS_HOST:$(route_port "$b" "$i")"$'\n'
  done
  cat >"$conf.tmp.$$" <<EOF
# written by scripts/nats-cluster.sh; rewritten at every start
server_name: bus-n$n-$b
listen: $NATS_HOST:$(client_port "$b" "$n")
http: $NATS_HOST:$(monitor_port "$b" "$n")
max_payload: $MAX_PAYLOAD
jetstream {
  store_dir: "$d/store"
  sync_interval: always
}
cluster {
  name: bus-cluster-$b
  listen: $NATS_HOST:$(route_port "$b" "$n")
  routes: [
$routes  ]
}
EOF
  mv -f "$conf.tmp.$$" "$conf"
  echo "$conf"
}

healthy() { # healthy BASE NODE: JetStream on this node is current with the meta group,
  # and the node knows the group's leader (/healthz alone passed 291 ms after a fresh start,
  # and a client's first JetStream request then went unanswered in a CI rehearsal)
  http_ok "http://$NATS_HOST:$(monitor_port "$1" "$2")/healthz" || return 1
  http_body "http://$NATS_HOST:$(monitor_port "$1" "$2")/jsz" | grep -q '"leader": *"[^"]'
}

http_body() { # http_body URL: the body of a GET on stdout (curl, else python3)
  if command -v curl >/dev/null 2>&1; then
    curl -fsS --max-time 2 "$1" 2>/dev/null
  else
    python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$1" 2>/dev/null
  fi
}


start_node() { # start_node BASE NODE (no wait)
  local b="$1" n="$2" d pf lf bin pid conf p
  d="$(nodedir "$b" "$n")"; pf="$(pidfile "$b" "$n")"; lf="$(logfile "$b" "$n")"
  if pid="$(running_pid "$b" "$n")"; then log "node $n already running (pid $pid)"; return 0; fi
  rm -f "$pf"
  bin="$(nats_bin)" || { cmd_install >/dev/null; bin="$(nats_bin)"; }
  for p in "$(client_port "$b" "$n")" "$(route_port "$b" "$n")" "$(monitor_port "$b" "$n")"; do
    port_open "$NATS_HOST" "$p" && die "port $p on $NATS_HOST is already in use by another process"
  done
  mkdir -p "$d/store"
  conf="$(write_conf "$b" "$n")"
  "$bin" -c "$conf" -t >/dev/null 2>&1 || die "nats-server rejects $conf"
  echo "==== $(date -u +%FT%TZ) start node=$n base=$b" >>"$lf"
  nohup "$bin" -c "$conf" >>"$lf" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pf"
  log "node $n: pid $pid, client $(client_port "$b" "$n"), routes $(route_port "$b" "$n"), log $lf"
}

cluster_dir() { echo "$BUS_BROKER_RUN/nats-cluster-$1"; }
node_log() { logfile "$1" "$2"; }
node_port() { client_port "$1" "$2"; }
cluster_prepare() { ensure_http_client; }
node_ready() { healthy "$1" "$2"; }
cluster_line() { echo "BUS_NATS_URL=$(urls "$1")"; }

cluster_main "$@"

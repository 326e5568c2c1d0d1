#!/usr/bin/env bash
# Native three-node Apache Kafka cluster (KRaft, each node broker+controller, so
# the controller quorum is three and survives the loss of any one node; with a
# single controller its loss would stop the whole cluster). Loopback only.
#
#   scripts/kafka-cluster.sh start [BASE]         format (first time), start nodes 0..2, wait;
#                                                 prints BUS_KAFKA_BROKERS=h:p,h:p,h:p
#   scripts/kafka-cluster.sh stop [BASE]          TERM (then KILL) every node
#   scripts/kafka-cluster.sh status [BASE]        exit 0 if every node is up and answers
#   scripts/kafka-cluster.sh env [BASE]           prints: export BUS_KAFKA_BROKERS=...
#   scripts/kafka-cluster.sh kill NODE [BASE]     kill -9 node NODE (0, 1 or 2)
#   scripts/kafka-cluster.sh restart NODE [BASE]  start node NODE again (same data), wait
#   scripts/kafka-cluster.sh wipe [BASE]          stop, then delete the cluster's data
#
# Ports of node i: broker BASE+i, controller BASE+100+i. min.insync.replicas=2 and
# internal topics at replication 3. Env: BUS_KAFKA_CLUSTER_BASE (29092),
# BUS_KAFKA_CLUSTER_HEAP_OPTS ("-Xms128m -Xmx256m" per node), BUS_KAFKA_START_TIMEOUT (120 s),
# BUS_BROKER_HOME, JAVA_HOME. Install steps: scripts/lib/kafka-install.sh (as kafka.sh).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=kafka-cluster
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"
# shellcheck source=lib/kafka-install.sh
. "$SCRIPT_DIR/lib/kafka-install.sh"

START_TIMEOUT="${BUS_KAFKA_START_TIMEOUT:-120}"
HEAP_OPTS="${BUS_KAFKA_CLUSTER_HEAP_OPTS:--Xms128m -Xmx256m}"
NODES=(0 1 2)

base() { echo "${1:-${BUS_KAFKA_CLUSTER_BASE:-29092}}"; }
broker_port() { echo $(( $1 + $2 )); }
controller_port() { echo $(( $1 + 100 + $2 )); }
clusterdir() { echo "$BUS_BROKER_RUN/kafka-cluster-$1"; }
nodedir() { echo "$(clusterdir "$1")/n$2"; }
pidfile() { echo "$(nodedir "$1" "$2").pid"; }
logfile() { echo "$(nodedir "$1" "$2").console.log"; }

brokers() {
  local b="$1" out="" i
  for i in "${NODES[@]}"; do out="$out${out:+,}$KAFKA_HOST:$(broker_port "$b" "$i")"; done
  echo "$out"
}

voters() {
  local b="$1" out="" i
  for i in "${NODES[@]}"; do out="$out${out:+,}$(( i + 1 ))@$KAFKA_HOST:$(controller_port "$b" "$i")"; done
  echo "$out"
}

write_props() { # write_props BASE NODE
  local b="$1" n="$2" d
  d="$(nodedir "$b" "$n")"
  cat >"$d/server.properties" <<EOF
# Written by scripts/kafka-cluster.sh on each start; edit the script, not this file.
process.roles=broker,controller
node.id=$(( n + 1 ))
controller.quorum.voters=$(voters "$b")
listeners=PLAINTEXT://$KAFKA_HOST:$(broker_port "$b" "$n"),CONTROLLER://$KAFKA_HOST:$(controller_port "$b" "$n")
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$(broker_port "$b" "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$d/data
# three nodes: internal topics replicated three times, acks=all needs two
offsets.topic.replication.factor=3
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
default.replication.factor=3
min.insync.replicas=2
num.partitions=1
unclean.leader.election.enable=false
# A killed node is fenced, and its partitions get new leaders, after 3 s
# without heartbeats instead of the default 9 s (publishing resumes within
# one operation timeout; bus-kafka/tests/cluster_faults.rs).
broker.session.timeout.ms=3000
broker.heartbeat.interval.ms=500
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=1000
log.initial.task.delay.ms=1000
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
EOF
}

running_pid() {
  local pid
  pid="$(pidfile_pid "$(pidfile "$1" "$2")")"
  pid_alive "$pid" kafka.Kafka && echo "$pid"
}

# metadata_ok BASE NODE TIMEOUT_S: a real Admin metadata request to this node succeeds.
metadata_ok() {
  local to="$3"; [ "$to" -lt 1 ] && to=1
  timeout "$to" bash -c '
    "$1" $2 -Dlog4j2.configurationFile="$3" -cp "$4/*" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$5" --list >/dev/null 2>&1' _ \
    "$(java_bin)" "$TOOLS_JVM_OPTS" "$KAFKA_TOOLS_LOG4J" "$KAFKA_LIBS" "$KAFKA_HOST:$(broker_port "$1" "$2")"
}

start_node() { # start_node BASE NODE (no wait)
  local b="$1" n="$2" d pf lf pid p cid
  d="$(nodedir "$b" "$n")"; pf="$(pidfile "$b" "$n")"; lf="$(logfile "$b" "$n")"
  if pid="$(running_pid "$b" "$n")"; then log "node $n already running (pid $pid)"; return 0; fi
  rm -f "$pf"
  for p in "$(broker_port "$b" "$n")" "$(controller_port "$b" "$n")"; do
    port_open "$KAFKA_HOST" "$p" && die "port $p on $KAFKA_HOST is already in use by another process"
  done
  mkdir -p "$d/data" "$d/logs"
  write_props "$b" "$n"
  if [ ! -f "$d/data/meta.properties" ]; then
    cid="$(cat "$(clusterdir "$b")/cluster-id")"
    tool kafka.tools.StorageTool format --ignore-formatted -t "$cid" \
      -c "$d/server.properties" >&2 || die "kafka storage format failed (node $n)"
  fi
  echo "==== $(date -u +%FT%TZ) start node=$n base=$b" >>"$lf"
  # shellcheck disable=SC2086
  nohup "$(java_bin)" $HEAP_OPTS $BROKER_JVM_OPTS \
    -Dkafka.logs.dir="$d/logs" -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$d/server.properties" >>"$lf" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$pf"
  log "node $n: pid $pid, broker $(broker_port "$b" "$n"), controller $(controller_port "$b" "$n"), logs $d/logs"
}

wait_nodes() { # wait_nodes BASE NODE...
  local b="$1"; shift
  local t0 end n pid
  t0="$(now_ms)"; end=$(( t0 + START_TIMEOUT * 1000 ))
  for n in "$@"; do
    until port_open "$KAFKA_HOST" "$(broker_port "$b" "$n")" \
        && metadata_ok "$b" "$n" $(( (end - $(now_ms)) / 1000 )); do
      pid="$(pidfile_pid "$(pidfile "$b" "$n")")"
      pid_alive "$pid" kafka.Kafka || { tail_log "$(nodedir "$b" "$n")/logs/server.log"; die "node $n exited during startup"; }
      [ "$(now_ms)" -ge "$end" ] && { tail_log "$(nodedir "$b" "$n")/logs/server.log"; die "node $n not ready after ${START_TIMEOUT}s"; }
      sleep 0.5
    done
  done
  log "ready in $(( $(now_ms) - t0 )) ms: nodes $*"
}

cmd_start() {
  local b n
  b="$(base "${1:-}")"
  ensure_installed
  mkdir -p "$(clusterdir "$b")"
  [ -f "$(clusterdir "$b")/cluster-id" ] || random_uuid >"$(clusterdir "$b")/cluster-id"
  for n in "${NODES[@]}"; do start_node "$b" "$n"; done
  wait_nodes "$b" "${NODES[@]}"
  echo "BUS_KAFKA_BROKERS=$(brokers "$b")"
}

cmd_stop() {
  local b n
  b="$(base "${1:-}")"
  for n in "${NODES[@]}"; do
    stop_pidfile "$(pidfile "$b" "$n")" kafka.Kafka "kafka-cluster:$b:n$n" "${BUS_KAFKA_STOP_TIMEOUT:-60}"
  done
}

cmd_status() {
  local b n pid bad=0
  b="$(base "${1:-}")"
  ensure_installed
  for n in "${NODES[@]}"; do
    if pid="$(running_pid "$b" "$n")" && metadata_ok "$b" "$n" 30; then
      log "node $n: running, pid $pid, port $(broker_port "$b" "$n"), rss $(rss_kb "$pid") KiB"
    else
      log "node $n: not running/answering (port $(broker_port "$b" "$n"))"; bad=1
    fi
  done
  return "$bad"
}

check_node() { case "${1:-}" in 0|1|2) ;; *) die "NODE must be 0, 1 or 2 (got '${1:-}')";; esac; }

cmd_kill() {
  check_node "${1:-}"
  local n="$1" b pid
  b="$(base "${2:-}")"
  pid="$(running_pid "$b" "$n")" || die "node $n not running"
  kill -KILL "$pid"
  while pid_alive "$pid" kafka.Kafka; do sleep 0.05; done
  rm -f "$(pidfile "$b" "$n")"
  log "node $n: killed (pid $pid, SIGKILL)"
}

cmd_restart() {
  check_node "${1:-}"
  local n="$1" b
  b="$(base "${2:-}")"
  ensure_installed
  start_node "$b" "$n"
  wait_nodes "$b" "$n"
}

cmd_wipe() {
  local b
  b="$(base "${1:-}")"
  cmd_stop "$b"
  rm -rf "$(clusterdir "$b")"
  log "wiped $(clusterdir "$b")"
}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  start)   cmd_start "$@" ;;
  stop)    cmd_stop "$@" ;;
  status)  cmd_status "$@" ;;
  env)     echo "export BUS_KAFKA_BROKERS=$(brokers "$(base "${1:-}")")" ;;
  kill)    cmd_kill "$@" ;;
  restart) cmd_restart "$@" ;;
  wipe)    cmd_wipe "$@" ;;
  *)       usage ;;
esac

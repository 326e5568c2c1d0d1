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
# shellcheck source=lib/cluster.sh
. "$SCRIPT_DIR/lib/cluster.sh"

START_TIMEOUT="${BUS_KAFKA_START_TIMEOUT:-120}"
HEAP_OPTS="${BUS_KAFKA_CLUSTER_HEAP_OPTS:--Xms128m -Xmx256m}"
NODES=(0 1 2)
CLUSTER_PROC=kafka.Kafka
CLUSTER_STOP_TIMEOUT="${BUS_KAFKA_STOP_TIMEOUT:-60}"

base() { echo "${1:-${BUS_KAFKA_CLUSTER_BASE:-29092}}"; }
broker_port() { echo $(( $1 + $2 )); }
controller_port() { echo $(( $1 + 100 + $2 )); }
cluster_dir() { echo "$BUS_BROKER_RUN/kafka-cluster-$1"; }
nodedir() { echo "$(cluster_dir "$1")/n$2"; }
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
  [ -f "$(cluster_dir "$b")/cluster-id" ] || random_uuid >"$(cluster_dir "$b")/cluster-id"
  write_props "$b" "$n"
  if [ ! -f "$d/data/meta.properties" ]; then
    cid="$(cat "$(cluster_dir "$b")/cluster-id")"
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

node_log() { echo "$(nodedir "$1" "$2")/logs/server.log"; }
node_port() { broker_port "$1" "$2"; }
cluster_prepare() { ensure_installed; }
node_ready() { port_open "$KAFKA_HOST" "$(broker_port "$1" "$2")" && metadata_ok "$1" "$2" "$3"; }
cluster_line() { echo "BUS_KAFKA_BROKERS=$(brokers "$1")"; }

cluster_main "$@"

#!/usr/bin/env bash
# Native single-node Apache Kafka (KRaft, broker+controller in one JVM) for local runs
# and CI (no Docker). The jars come from Maven Central through scripts/kafka/pom.xml.
#
#   scripts/kafka.sh install              resolve the broker + CLI jars into a cached dir
#   scripts/kafka.sh start [PORT] [DIR]   format (first time), start, wait; prints BUS_KAFKA_BROKERS=...
#   scripts/kafka.sh stop [PORT]          TERM (then KILL) by pidfile
#   scripts/kafka.sh env [PORT]           prints: export BUS_KAFKA_BROKERS=...
#   scripts/kafka.sh status [PORT]        exit 0 if running and answering metadata requests
#   scripts/kafka.sh smoke [PORT]         create a topic, produce and consume one message, delete it
#   scripts/kafka.sh topics ARGS...       org.apache.kafka.tools.TopicCommand (add --bootstrap-server)
#   scripts/kafka.sh run MAINCLASS ARGS   any main class on the Kafka classpath
#
# Env: BUS_KAFKA_PORT (9092), BUS_KAFKA_CONTROLLER_PORT (PORT+1), BUS_KAFKA_VERSION (4.4.0),
#      BUS_KAFKA_HEAP_OPTS ("-Xms256m -Xmx512m"), BUS_KAFKA_JVM_OPTS (extra JVM flags),
#      BUS_KAFKA_START_TIMEOUT (90 s), BUS_BROKER_HOME (~/.cache/bus-brokers), JAVA_HOME.
#      Human messages go to stderr, data lines to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=kafka
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"

# shellcheck source=lib/kafka-install.sh
. "$SCRIPT_DIR/lib/kafka-install.sh"

START_TIMEOUT="${BUS_KAFKA_START_TIMEOUT:-90}"
HEAP_OPTS="${BUS_KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}"
kafka_port() { echo "${1:-${BUS_KAFKA_PORT:-9092}}"; }
controller_port() { echo "${BUS_KAFKA_CONTROLLER_PORT:-$(( $1 + 1 ))}"; }
rundir() { echo "$BUS_BROKER_RUN/kafka-$1"; }
pidfile() { echo "$BUS_BROKER_RUN/kafka-$1.pid"; }
logfile() { echo "$BUS_BROKER_RUN/kafka-$1.log"; }   # JVM stdout/stderr; server.log is in rundir/logs

# ---------------------------------------------------------------- broker
write_props() { # write_props FILE PORT CPORT DATA
  cat >"$1" <<EOF
# Written by scripts/kafka.sh on each start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$KAFKA_HOST:$3
listeners=PLAINTEXT://$KAFKA_HOST:$2,CONTROLLER://$KAFKA_HOST:$3
advertised.listeners=PLAINTEXT://$KAFKA_HOST:$2
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$4
# single node: every internal topic with one replica, few partitions
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1
num.partitions=1
# fast tests: no rebalance delay; lean threads for a 2-core machine
group.initial.rebalance.delay.ms=0
# Check retention every second (default 5 min) so topics with short
# retention.ms expire promptly; bus-kafka then reports native retention.
log.retention.check.interval.ms=1000
log.initial.task.delay.ms=1000
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
background.threads=2
log.cleaner.threads=1
# auto.create.topics.enable stays at its default (true) on purpose.
EOF
}

running_pid() { # running_pid PORT
  local pid
  pid="$(pidfile_pid "$(pidfile "$1")")"
  pid_alive "$pid" kafka.Kafka && echo "$pid"
}

# metadata_ok PORT TIMEOUT_S: a real Admin metadata request (list topics) succeeds.
metadata_ok() {
  local to="$2"; [ "$to" -lt 1 ] && to=1
  timeout "$to" bash -c '
    "$1" $2 -Dlog4j2.configurationFile="$3" -cp "$4/*" org.apache.kafka.tools.TopicCommand \
      --bootstrap-server "$5" --list >/dev/null 2>&1' _ \
    "$(java_bin)" "$TOOLS_JVM_OPTS" "$KAFKA_TOOLS_LOG4J" "$KAFKA_LIBS" "$KAFKA_HOST:$1"
}

cmd_start() {
  local port cport data rd pf lf pid
  port="$(kafka_port "${1:-}")"
  cport="$(controller_port "$port")"
  rd="$(rundir "$port")"
  data="${2:-$rd/data}"
  pf="$(pidfile "$port")"; lf="$(logfile "$port")"
  ensure_installed
  mkdir -p "$rd/logs"

  local t0 end
  t0="$(now_ms)"; end=$(( t0 + START_TIMEOUT * 1000 ))
  if pid="$(running_pid "$port")"; then
    if port_open "$KAFKA_HOST" "$port" && metadata_ok "$port" 30; then
      log "already running (pid $pid, port $port)"
      echo "BUS_KAFKA_BROKERS=$KAFKA_HOST:$port"
      return 0
    fi
    log "pid $pid alive but not answering yet; waiting for it"
  else
    rm -f "$pf"
    local p
    for p in "$port" "$cport"; do
      port_open "$KAFKA_HOST" "$p" && die "port $p on $KAFKA_HOST is already in use by another process"
    done
    mkdir -p "$data"
    write_props "$rd/server.properties" "$port" "$cport" "$data"
    if [ ! -f "$data/meta.properties" ]; then
      local cid
      cid="$(random_uuid)"
      log "formatting $data (cluster id $cid)"
      tool kafka.tools.StorageTool format --ignore-formatted -t "$cid" \
        -c "$rd/server.properties" >&2 || die "kafka storage format failed"
    fi
    log "starting Kafka $KAFKA_VERSION on $KAFKA_HOST:$port (controller $cport, data $data, logs $rd/logs, console $lf)"
    echo "==== $(date -u +%FT%TZ) start port=$port data=$data" >>"$lf"
    # shellcheck disable=SC2086
    nohup "$(java_bin)" $HEAP_OPTS $BROKER_JVM_OPTS \
      -Dkafka.logs.dir="$rd/logs" -Dlog4j2.configurationFile="$KAFKA_LOG4J" \
      -cp "$KAFKA_LIBS/*" kafka.Kafka "$rd/server.properties" >>"$lf" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$pf"
  fi

  # 1) bounded poll until the PLAINTEXT listener accepts connections
  until port_open "$KAFKA_HOST" "$port"; do
    if ! pid_alive "$pid" kafka.Kafka; then
      rm -f "$pf"; tail_log "$lf"; tail_log "$rd/logs/server.log"; die "kafka (pid $pid) exited during startup"
    fi
    if [ "$(now_ms)" -ge "$end" ]; then
      tail_log "$rd/logs/server.log"; die "kafka not listening after ${START_TIMEOUT}s (pid $pid left running; run: $0 stop $port)"
    fi
    sleep 0.2
  done
  local t_port; t_port="$(now_ms)"
  # 2) a real metadata request, retried until the deadline
  until metadata_ok "$port" $(( (end - $(now_ms)) / 1000 )); do
    pid_alive "$pid" kafka.Kafka || { rm -f "$pf"; tail_log "$lf"; die "kafka (pid $pid) exited during startup"; }
    if [ "$(now_ms)" -ge "$end" ]; then
      tail_log "$rd/logs/server.log"; die "kafka not answering metadata requests after ${START_TIMEOUT}s (pid $pid left running)"
    fi
    sleep 0.5
  done
  local t1; t1="$(now_ms)"
  log "ready in $(( t1 - t0 )) ms (listening after $(( t_port - t0 )) ms; pid $pid, rss $(rss_kb "$pid") KiB)"
  echo "BUS_KAFKA_BROKERS=$KAFKA_HOST:$port"
}

cmd_stop() {
  local port
  port="$(kafka_port "${1:-}")"
  stop_pidfile "$(pidfile "$port")" kafka.Kafka "kafka:$port" "${BUS_KAFKA_STOP_TIMEOUT:-60}"
}

cmd_status() {
  local port pid
  port="$(kafka_port "${1:-}")"
  if pid="$(running_pid "$port")" && port_open "$KAFKA_HOST" "$port" && metadata_ok "$port" 30; then
    log "running: pid $pid, port $port, rss $(rss_kb "$pid") KiB"
    return 0
  fi
  log "not running on port $port"
  return 1
}

cmd_env() { echo "export BUS_KAFKA_BROKERS=$KAFKA_HOST:$(kafka_port "${1:-}")"; }

cmd_smoke() {
  local port bs topic msg got
  port="$(kafka_port "${1:-}")"; bs="$KAFKA_HOST:$port"
  ensure_installed
  topic="bus-smoke-$$-$(date +%s)"; msg="hello-bus-$(date +%s%N)"
  log "smoke: create topic $topic"
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bs" --create --topic "$topic" \
    --partitions 1 --replication-factor 1 >&2
  log "smoke: produce one message"
  printf '%s\n' "$msg" | tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$bs" \
    --topic "$topic" >&2
  log "smoke: consume it back"
  got="$(tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$bs" --topic "$topic" \
    --from-beginning --max-messages 1 --timeout-ms 30000 2>/dev/null || true)"
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$bs" --delete --topic "$topic" >&2 || true
  [ "$got" = "$msg" ] || die "smoke: consumed '$got', expected '$msg'"
  log "smoke ok: $topic round trip"
}

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  install) cmd_install ;;
  start)   cmd_start "$@" ;;
  stop)    cmd_stop "$@" ;;
  env)     cmd_env "$@" ;;
  status)  cmd_status "$@" ;;
  smoke)   cmd_smoke "$@" ;;
  topics)  ensure_installed; tool org.apache.kafka.tools.TopicCommand "$@" ;;
  run)     ensure_installed; [ $# -ge 1 ] || usage; tool "$@" ;;
  *)       usage ;;
esac

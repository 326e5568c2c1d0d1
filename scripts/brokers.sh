#!/usr/bin/env bash
# All brokers at once, natively (no Docker):
#
#   eval "$(scripts/brokers.sh up)"   install + start NATS (JetStream), Kafka (KRaft) and PostgreSQL;
#                                     stdout carries ONLY the export lines:
#                                       export BUS_NATS_URL=nats://127.0.0.1:4222
#                                       export BUS_KAFKA_BROKERS=127.0.0.1:9092
#                                       export BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:5433/bus
#   scripts/brokers.sh down           stop all
#   scripts/brokers.sh env            print the export lines (no start)
#   scripts/brokers.sh status         exit 0 if all are up
#
# Ports: BUS_NATS_PORT (4222), BUS_KAFKA_PORT (9092), BUS_POSTGRES_PORT (5433); see scripts/nats.sh,
# scripts/kafka.sh and scripts/postgres.sh.
# Everything but the export lines goes to stderr.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NATS="$SCRIPT_DIR/nats.sh"
KAFKA="$SCRIPT_DIR/kafka.sh"
POSTGRES="$SCRIPT_DIR/postgres.sh"

up() {
  "$NATS" install >&2
  "$KAFKA" install >&2
  "$POSTGRES" install >&2
  "$NATS" start >&2
  "$KAFKA" start >&2
  "$POSTGRES" start >&2
  "$NATS" env
  "$KAFKA" env
  "$POSTGRES" env
}

down() {
  local rc=0
  "$POSTGRES" stop || rc=1
  "$KAFKA" stop || rc=1
  "$NATS" stop || rc=1
  return "$rc"
}

status() {
  local rc=0
  "$NATS" status || rc=1
  "$KAFKA" status || rc=1
  "$POSTGRES" status || rc=1
  return "$rc"
}

case "${1:-}" in
  up)     up ;;
  down)   down ;;
  env)    "$NATS" env; "$KAFKA" env; "$POSTGRES" env ;;
  status) status ;;
  *)      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The cluster checks of issue 19 on a fresh machine (nats-server installed by
# scripts/nats.sh install when missing):
#   1. the conformance suite against a three-node NATS cluster
#      (scripts/nats-cluster.sh, ports from BUS_NATS_CLUSTER_BASE, default
#      24222) with every topic at replication factor 3;
#   2. the conformance suite and bus-kafka/tests/replication.rs against a
#      three-node Kafka cluster (scripts/kafka-cluster.sh, ports from
#      BUS_KAFKA_CLUSTER_BASE, default 29092) at replication factor 3
#      (skipped with BUS_KAFKA_CLUSTER=0);
#   (with BUS_KAFKA_FAULTS=1 also the ignored Kafka leader-kill test, which
#   starts a cluster of its own and fails today: see README)
#   3. the NATS fault tests (bus-nats/tests/cluster_faults.rs), which start
#      and kill clusters of their own on free ports, the ignored leader-kill
#      test included (skipped with BUS_CLUSTER_FAULTS=0: CI runs the others
#      in scripts/test.sh; the leader-kill one is not yet reliable enough
#      for CI, see README "Clusters and durability").
# The cluster it starts is stopped and wiped on exit. Extra args go to cargo test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

base="${BUS_NATS_CLUSTER_BASE:-24222}"
kbase="${BUS_KAFKA_CLUSTER_BASE:-29092}"
cleanup() {
  scripts/nats-cluster.sh wipe "$base" >&2 || true
  [ "${BUS_KAFKA_CLUSTER:-1}" = 0 ] || scripts/kafka-cluster.sh wipe "$kbase" >&2 || true
}
trap cleanup EXIT
scripts/nats-cluster.sh wipe "$base" >&2
exports="$(scripts/nats-cluster.sh start "$base")"
export "$exports" BUS_REQUIRE_BROKERS=1 BUS_REPLICATION_FACTOR=3
echo "test-clusters.sh: $exports BUS_REPLICATION_FACTOR=3" >&2

t0=$(date +%s)
cargo test -p bus-nats --test conformance "$@"
t1=$(date +%s)
if [ "${BUS_KAFKA_CLUSTER:-1}" != 0 ]; then
  scripts/kafka-cluster.sh wipe "$kbase" >&2
  kexports="$(scripts/kafka-cluster.sh start "$kbase")"
  echo "test-clusters.sh: $kexports BUS_REPLICATION_FACTOR=3" >&2
  env "$kexports" cargo test -p bus-kafka --test conformance --test replication "$@"
  scripts/kafka-cluster.sh wipe "$kbase" >&2
  if [ "${BUS_KAFKA_FAULTS:-0}" = 1 ]; then
    cargo test -p bus-kafka --test cluster_faults "$@" -- --ignored --nocapture
  fi
fi
tk=$(date +%s)
if [ "${BUS_CLUSTER_FAULTS:-1}" != 0 ]; then
  cargo test -p bus-nats --test cluster_faults "$@" -- --include-ignored --test-threads 1 --nocapture
fi
t2=$(date +%s)
echo "test-clusters.sh: NATS cluster suite $((t1 - t0)) s, Kafka cluster suite $((tk - t1)) s, NATS fault tests $((t2 - tk)) s" >&2

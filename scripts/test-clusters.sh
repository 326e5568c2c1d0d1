#!/usr/bin/env bash
# The cluster checks of issue 19 on a fresh machine (nats-server installed by
# scripts/nats.sh install when missing):
#   1. the conformance suite and the durable-consumer suite (C20-C23) against a three-node NATS cluster
#      (scripts/nats-cluster.sh, ports from BUS_NATS_CLUSTER_BASE, default
#      24222) with every topic at replication factor 3;
#   2. the conformance suite, the durable-consumer suite (C20-C23) and
#      bus-kafka/tests/replication.rs against a
#      three-node Kafka cluster (scripts/kafka-cluster.sh, ports from
#      BUS_KAFKA_CLUSTER_BASE, default 29092) at replication factor 3
#      (skipped with BUS_KAFKA_CLUSTER=0);
#   3. the NATS leader-kill fault tests, #[ignore]d in `cargo test` (they kill
#      nodes and take up to a minute each: the topic stream's leader under
#      load, and the durable-consumer bucket's leader mid-consume, #28),
#      run once: a failure fails; each
#      starts a cluster of its own on free ports (skipped with
#      BUS_CLUSTER_FAULTS=0). The other fault tests, NATS
#      (bus-nats/tests/cluster_faults.rs) and Kafka
#      (bus-kafka/tests/cluster_faults.rs), each on clusters of their own,
#      run in scripts/test.sh with the rest of the workspace; with
#      BUS_CLUSTER_FAULTS=all they run here too.
# The clusters it starts are stopped and wiped on exit. The tests are the binaries of
# scripts/test.sh's build (`cargo test --workspace --all-features`; built here when missing),
# run as cargo test runs them. Extra args go to cargo's build (e.g. -j 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/test-bins.sh
. scripts/lib/test-bins.sh
bins="$(mktemp)"
test_binaries "$bins" "$@"

base="${BUS_NATS_CLUSTER_BASE:-24222}"
kbase="${BUS_KAFKA_CLUSTER_BASE:-29092}"
cleanup() {
  scripts/nats-cluster.sh wipe "$base" >&2 || true
  [ "${BUS_KAFKA_CLUSTER:-1}" = 0 ] || scripts/kafka-cluster.sh wipe "$kbase" >&2 || true
  rm -f "$bins"
}
trap cleanup EXIT
scripts/nats-cluster.sh wipe "$base" >&2
exports="$(scripts/nats-cluster.sh start "$base")"
export "$exports" BUS_REQUIRE_BROKERS=1 BUS_REPLICATION_FACTOR=3
echo "test-clusters.sh: $exports BUS_REPLICATION_FACTOR=3" >&2

t0=$(date +%s)
run_binary "$bins" bus-nats conformance
run_binary "$bins" bus-nats consumers
t1=$(date +%s)
if [ "${BUS_KAFKA_CLUSTER:-1}" != 0 ]; then
  scripts/kafka-cluster.sh wipe "$kbase" >&2
  kexports="$(scripts/kafka-cluster.sh start "$kbase")"
  echo "test-clusters.sh: $kexports BUS_REPLICATION_FACTOR=3" >&2
  for target in conformance consumers replication; do
    (export "$kexports" && run_binary "$bins" bus-kafka "$target")
  done
  scripts/kafka-cluster.sh wipe "$kbase" >&2
fi
tk=$(date +%s)
case "${BUS_CLUSTER_FAULTS:-1}" in
  0) ;;
  all)
    run_binary "$bins" bus-nats cluster_faults --include-ignored --test-threads 1 --nocapture
    run_binary "$bins" bus-kafka cluster_faults --nocapture
    ;;
  *)
    run_binary "$bins" bus-nats cluster_faults --ignored --nocapture
    ;;
esac
t2=$(date +%s)
echo "test-clusters.sh: NATS cluster suite $((t1 - t0)) s, Kafka cluster suite $((tk - t1)) s, fault tests $((t2 - tk)) s" >&2

#!/usr/bin/env bash
# The cluster checks of issue 19 on a fresh machine (nats-server installed by
# scripts/nats.sh install when missing):
#   1. the conformance suite against a three-node NATS cluster
#      (scripts/nats-cluster.sh, ports from BUS_NATS_CLUSTER_BASE, default
#      24222) with every topic at replication factor 3;
#   2. the NATS fault tests (bus-nats/tests/cluster_faults.rs), which start
#      and kill clusters of their own on free ports (skipped with
#      BUS_CLUSTER_FAULTS=0: CI runs them already in scripts/test.sh).
# The cluster it starts is stopped and wiped on exit. Extra args go to cargo test.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

base="${BUS_NATS_CLUSTER_BASE:-24222}"
cleanup() { scripts/nats-cluster.sh wipe "$base" >&2 || true; }
trap cleanup EXIT
scripts/nats-cluster.sh wipe "$base" >&2
exports="$(scripts/nats-cluster.sh start "$base")"
export "$exports" BUS_REQUIRE_BROKERS=1 BUS_REPLICATION_FACTOR=3
echo "test-clusters.sh: $exports BUS_REPLICATION_FACTOR=3" >&2

t0=$(date +%s)
cargo test -p bus-nats --test conformance "$@"
t1=$(date +%s)
if [ "${BUS_CLUSTER_FAULTS:-1}" != 0 ]; then
  cargo test -p bus-nats --test cluster_faults "$@" -- --test-threads 1 --nocapture
fi
t2=$(date +%s)
echo "test-clusters.sh: NATS cluster suite $((t1 - t0)) s, NATS fault tests $((t2 - t1)) s" >&2

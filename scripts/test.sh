#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs build dependencies,
# installs and starts one NATS, one Kafka and one PostgreSQL broker and an S3 server (SeaweedFS)
# natively, runs every
# test of the workspace with every backend compiled in and
# BUS_REQUIRE_BROKERS=1 (a missing broker fails instead of skipping), then
# stops the brokers it started.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/install-deps.sh
# The cold tier's S3 server (SeaweedFS, #30) is built from its Go module once per broker home:
# about 15 min on a fresh 2-core machine, 12-100 s with warm Go caches, nothing once cached.
# The build starts first, in the background, beside the brokers and the Rust build below.
weed_log="$(mktemp)"
scripts/seaweedfs.sh install >"$weed_log" 2>&1 &
weed_install=$!
started=0
s3_started=0
cleanup() {
  [ "$s3_started" = 1 ] && scripts/seaweedfs.sh stop >&2 || true
  [ "$started" = 1 ] && scripts/brokers.sh down >&2 || true
  rm -rf "${lanes:-}"
}
trap cleanup EXIT
exports="$(scripts/brokers.sh up)"
started=1
eval "$exports"
export BUS_REQUIRE_BROKERS=1
echo "test.sh: BUS_NATS_URL=$BUS_NATS_URL BUS_KAFKA_BROKERS=$BUS_KAFKA_BROKERS BUS_POSTGRES_URL=$BUS_POSTGRES_URL" >&2
# shellcheck source=lib/test-bins.sh
. scripts/lib/test-bins.sh
lanes="$(mktemp -d)"
test_binaries "$lanes/all" "$@"
wait "$weed_install" || { cat "$weed_log" >&2; echo "test.sh: building SeaweedFS failed" >&2; exit 1; }
cat "$weed_log" >&2
s3_started=1
scripts/seaweedfs.sh start >/dev/null
eval "$(scripts/seaweedfs.sh env)"
echo "test.sh: BUS_S3_ENDPOINT=$BUS_S3_ENDPOINT BUS_S3_BUCKET=$BUS_S3_BUCKET" >&2

# Three lanes run side by side, each its binaries one after another (every binary runs from
# its crate's directory, as cargo test runs it). Most of the time is spent waiting on brokers
# (JVM starts, fsyncs, session timeouts), so three lanes on two cores take about the longest
# lane instead of the sum (25 min in one lane on 2026-12-07). Lanes share the brokers started
# above, so no test may stop them: tests that kill or cut a broker start one of their own.
#   kafka-own:  bus-kafka's tests with brokers of their own (cluster faults, connection cuts, power cuts on
#               bus-testfs, outages, TLS/SASL), about 9 min;
#   kafka:      bus-kafka's other tests, on the shared broker, about 10 min;
#   rest:       every other crate (the power-cut tests of bus-embedded, bus-nats and
#               bus-postgres included), about 7 min.
# The long power-cut run: BUS_POWER_ROUNDS=200 (README).
own='^(cluster_faults|connection_cuts|power_cut|power_cut_cluster|outage|secure|subscribe_outage)$'
awk -F'\t' -v own="$own" '$1 == "bus-kafka" && $3 ~ own' "$lanes/all" >"$lanes/kafka-own"
awk -F'\t' -v own="$own" '$1 == "bus-kafka" && $3 !~ own' "$lanes/all" >"$lanes/kafka"
awk -F'\t' '$1 != "bus-kafka"' "$lanes/all" >"$lanes/rest"
t0="$(date +%s)"
pids=()
for lane in kafka-own kafka rest; do
  : >"$lanes/$lane.log"
  run_lane "$lanes/$lane" "$lanes/$lane.log" &
  pids+=("$!")
done
status=0
i=0
for lane in kafka-own kafka rest; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  i=$((i + 1))
  echo "==================== test.sh lane $lane ($(wc -l <"$lanes/$lane") binaries, $rc failed)" >&2
  cat "$lanes/$lane.log" >&2
  [ "$rc" = 0 ] || status=1
done
echo "test.sh: lanes took $(( $(date +%s) - t0 )) s; per binary:" >&2
grep -hE '^==== .* (passed|FAILED) in' "$lanes"/*.log | sed 's/^==== /  /' >&2
if [ "$status" != 0 ]; then
  grep -hE '^==== .* FAILED in' "$lanes"/*.log | sed 's/^==== /test.sh: /' >&2
  exit 1
fi
# The doc tests (--doc builds them; the lanes ran every other target).
cargo test --workspace --all-features --doc "$@"
# The feature-disabled errors only exist in a build without the backends.
cargo test -p bus --no-default-features --test open "$@"

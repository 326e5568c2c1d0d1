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
}
trap cleanup EXIT
exports="$(scripts/brokers.sh up)"
started=1
eval "$exports"
export BUS_REQUIRE_BROKERS=1
echo "test.sh: BUS_NATS_URL=$BUS_NATS_URL BUS_KAFKA_BROKERS=$BUS_KAFKA_BROKERS BUS_POSTGRES_URL=$BUS_POSTGRES_URL" >&2
cargo test --workspace --all-features --no-run "$@"
wait "$weed_install" || { cat "$weed_log" >&2; echo "test.sh: building SeaweedFS failed" >&2; exit 1; }
cat "$weed_log" >&2
s3_started=1
scripts/seaweedfs.sh start >/dev/null
eval "$(scripts/seaweedfs.sh env)"
echo "test.sh: BUS_S3_ENDPOINT=$BUS_S3_ENDPOINT BUS_S3_BUCKET=$BUS_S3_BUCKET" >&2

# The power-cut tests (#29; bus-testfs, run as root with /dev/fuse) are part of this run, short:
# bus-embedded 10 rounds per configuration, Interval torn cuts included (about 15 s), bus-nats
# 6+6+2 cuts (about 22 s), bus-postgres 4+4 (about 36 s), bus-kafka 2+2 (about 2 min: a JVM restart per cut). The long run: BUS_POWER_ROUNDS=200 (README).
# --all-features also compiles bus-conformance's testcontainers path; the
# broker URLs exported above take precedence over it.
cargo test --workspace --all-features "$@"
# The feature-disabled errors only exist in a build without the backends.
cargo test -p bus --no-default-features --test open "$@"

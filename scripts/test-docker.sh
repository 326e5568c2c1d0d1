#!/usr/bin/env bash
# CI's Docker part (.ci/run calls it after the native suite): the conformance suite of
# bus-nats, bus-kafka and bus-postgres, and on compose their durable-consumer suite (only
# those suites, not the whole workspace, to keep CI short)
#   1. against `docker-compose up` of the project's own images (scripts/docker.sh), then down;
#   2. (NATS and Kafka) with no broker URL and bus-conformance's `testcontainers` feature,
#      which starts (and logs, and removes) its own containers of the same images;
#   3. with no Docker engine reachable: the suite must fail under BUS_REQUIRE_BROKERS=1.
# Docker Engine comes from Debian's packages when none answers; a dockerd this script starts
# (under $BUS_BROKER_HOME/docker) is stopped at the end. Images are built locally (nothing is
# pulled) and stay cached in that data root. bus-conformance has no PostgreSQL container of
# its own (scripts/postgres.sh is its fallback), so PostgreSQL runs in the compose run only.
#
# Ports of the compose run (not the native defaults, so native brokers may keep running):
# BUS_DOCKER_NATS_PORT (14222), BUS_DOCKER_NATS_MONITOR_PORT (18222), BUS_DOCKER_KAFKA_PORT (19092),
# BUS_DOCKER_POSTGRES_PORT (15433), BUS_DOCKER_S3_PORT (17333, clear of the native SeaweedFS's gRPC ports (each port + 10000); the cold tier's round trip runs
# against the compose SeaweedFS).
# Extra arguments go to cargo (e.g. -j 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SCRIPT_DIR="$PWD/scripts"
BUS_LOG_TAG=test-docker
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"

export BUS_REQUIRE_BROKERS=1
export BUS_NATS_IMAGE="${BUS_NATS_IMAGE:-bus-nats:2.15.1}"
export BUS_KAFKA_IMAGE="${BUS_KAFKA_IMAGE:-bus-kafka:4.4.0}"
export BUS_POSTGRES_IMAGE="${BUS_POSTGRES_IMAGE:-bus-postgres:15}"
# The workspace's own build of test.sh (--workspace --all-features, which has the
# testcontainers feature; scripts/lib/test-bins.sh): reused as is.
# shellcheck source=lib/test-bins.sh
. "$SCRIPT_DIR/lib/test-bins.sh"
declare -A TEST_BIN CONSUMERS_BIN
T_ALL="$(now_ms)"
STEPS=()
RESULTS=()

# step NAME CMD...: run and record its wall time.
step() {
  local name="$1" t0 rc=0; shift
  t0="$(now_ms)"
  log "---- $name"
  "$@" || rc=$?
  STEPS+=("$(printf '%-34s %7.1f s%s' "$name" "$(( $(now_ms) - t0 ))e-3" "$([ "$rc" = 0 ] || echo "  (exit $rc)")")")
  return "$rc"
}

# compile: find (or build) the workspace's test binaries, note the conformance and consumers
# binaries of bus-nats, bus-kafka and bus-postgres.
compile() {
  BINS="$(mktemp)"
  test_binaries "$BINS" "${EXTRA[@]}" || return 1
  local crate
  for crate in bus-nats bus-kafka bus-postgres; do
    TEST_BIN[$crate]="$(binary_of "$BINS" "$crate" conformance)" || return 1
    CONSUMERS_BIN[$crate]="$(binary_of "$BINS" "$crate" consumers)" || return 1
  done
  COLD_BIN="$(binary_of "$BINS" bus-cold roundtrip)" || return 1
  log "conformance binaries: ${TEST_BIN[bus-nats]} ${TEST_BIN[bus-kafka]} ${TEST_BIN[bus-postgres]}"
}

# suite RUN BACKEND [ARGS]: the conformance tests of one backend (run from its crate, as
# cargo test does); records its passed/failed counts. With SUITE=consumers, its
# durable-consumer suite (C20-C23) instead.
suite() {
  local run="$1" backend="$2" out rc=0 bin; shift 2
  if [ "${SUITE:-conformance}" = consumers ]; then bin="${CONSUMERS_BIN[bus-$backend]}"; else bin="${TEST_BIN[bus-$backend]}"; fi
  out="$(mktemp)"
  (cd "bus-$backend" && "$bin" "$@") 2>&1 | tee "$out" >&2 || rc=$?
  RESULTS+=("$(printf '%-15s %-8s %-11s %s' "$run" "$backend" "${SUITE:-conformance}" \
    "$(grep -E '^test result:' "$out" | sed -E 's/.*: (ok|FAILED)\. ([0-9]+) passed; ([0-9]+) failed.*/\2 passed, \3 failed/' | tail -n1)")")
  rm -f "$out"
  return "$rc"
}

# cold_roundtrip: the cold tier's round trip and idempotence cases (bus-cold) against the S3
# server BUS_S3_ENDPOINT names (the compose SeaweedFS); records its counts.
cold_roundtrip() {
  local out rc=0
  out="$(mktemp)"
  (cd bus-cold && "$COLD_BIN") 2>&1 | tee "$out" >&2 || rc=$?
  RESULTS+=("$(printf '%-15s %-8s %-11s %s' compose s3 cold \
    "$(grep -E '^test result:' "$out" | sed -E 's/.*: (ok|FAILED)\. ([0-9]+) passed; ([0-9]+) failed.*/\2 passed, \3 failed/' | tail -n1)")")
  rm -f "$out"
  return "$rc"
}
summary() {
  {
    echo "==== test-docker.sh summary (total $(( ($(now_ms) - T_ALL) / 1000 )) s)"
    printf '  %s\n' "${STEPS[@]}"
    echo "  per backend (the conformance suite; the consumer suite on compose):"
    [ "${#RESULTS[@]}" -gt 0 ] && printf '  %s\n' "${RESULTS[@]}"
  } >&2
}

EXTRA=("$@")
own_daemon=0
composed=0
cleanup() {
  local rc=$?
  [ "$composed" = 1 ] && { scripts/docker.sh down || rc=1; }
  if [ "$own_daemon" = 1 ]; then
    # nothing of ours may be left: containers, networks, volumes
    local left
    left="$(docker ps -aq)$(docker volume ls -q)$(docker network ls -q --filter type=custom)"
    [ -z "$left" ] || { log "left behind: $left"; docker ps -a >&2; rc=1; }
    scripts/docker.sh stop || rc=1
  fi
  rm -f "${EXPORTS:-}" "${BINS:-}"
  summary
  exit "$rc"
}
trap cleanup EXIT

step "install Docker (apt, if missing)" scripts/docker.sh install
# a daemon already answering is reused (and not stopped); else ours starts and stops here
pid_before="$(cat "$BUS_BROKER_HOME/docker/dockerd.pid" 2>/dev/null || true)"
EXPORTS="$(mktemp)"
to_exports() { "$@" >"$EXPORTS"; }
step "start dockerd (or reuse one)" to_exports scripts/docker.sh start
eval "$(cat "$EXPORTS")"
pid_after="$(cat "$BUS_BROKER_HOME/docker/dockerd.pid" 2>/dev/null || true)"
[ "$DOCKER_HOST" = "unix://$BUS_BROKER_HOME/docker/docker.sock" ] && [ -n "$pid_after" ] \
  && [ "$pid_after" != "$pid_before" ] && own_daemon=1
log "DOCKER_HOST=$DOCKER_HOST (started here: $own_daemon)"
step "build images (cached)" scripts/docker.sh images
step "compile the conformance tests" compile

# 1. docker-compose
export BUS_NATS_PORT="${BUS_DOCKER_NATS_PORT:-14222}" BUS_NATS_MONITOR_PORT="${BUS_DOCKER_NATS_MONITOR_PORT:-18222}"
export BUS_KAFKA_PORT="${BUS_DOCKER_KAFKA_PORT:-19092}" BUS_POSTGRES_PORT="${BUS_DOCKER_POSTGRES_PORT:-15433}"
export BUS_S3_PORT="${BUS_DOCKER_S3_PORT:-17333}"
composed=1
step "compose up (until healthy)" to_exports scripts/docker.sh up
eval "$(cat "$EXPORTS")"
log "compose: BUS_NATS_URL=$BUS_NATS_URL BUS_KAFKA_BROKERS=$BUS_KAFKA_BROKERS BUS_POSTGRES_URL=$BUS_POSTGRES_URL BUS_S3_ENDPOINT=$BUS_S3_ENDPOINT"
step "compose: nats conformance" suite compose nats
step "compose: kafka conformance" suite compose kafka
step "compose: postgres conformance" suite compose postgres
SUITE=consumers step "compose: nats consumers" suite compose nats
SUITE=consumers step "compose: kafka consumers" suite compose kafka
SUITE=consumers step "compose: postgres consumers" suite compose postgres
step "compose: cold tier on S3" cold_roundtrip
composed=0
step "compose down -v" scripts/docker.sh down

# 2. testcontainers: no broker URL, the suite starts its own containers
unset BUS_NATS_URL BUS_KAFKA_BROKERS BUS_POSTGRES_URL BUS_S3_ENDPOINT BUS_S3_BUCKET
step "testcontainers: nats conformance" suite testcontainers nats
step "testcontainers: kafka conformance" suite testcontainers kafka
# the reapers remove the containers once each test process has exited
end=$(( $(now_ms) + 30000 ))
until [ -z "$(docker ps -aq --filter label=bus.conformance)" ]; do
  [ "$(now_ms)" -lt "$end" ] || { docker ps -a >&2; die "testcontainers left containers behind"; }
  sleep 0.5
done
log "testcontainers: no container with label bus.conformance left"

# 3. no Docker engine: one case must fail loudly, not skip
absent() {
  local out rc=0
  out="$(cd bus-nats && DOCKER_HOST="unix://$BUS_BROKER_HOME/docker/absent.sock" \
    "${TEST_BIN[bus-nats]}" c01_bad_manifests_name_the_field 2>&1)" || rc=$?
  printf '%s\n' "$out" | grep -E 'panicked|no container could be started|test result' >&2 || true
  [ "$rc" != 0 ] && printf '%s' "$out" | grep -q 'no container could be started' \
    || { log "expected a failure without Docker (exit $rc)"; return 1; }
  log "without Docker the suite fails as it must"
}
step "testcontainers: no Docker fails" absent

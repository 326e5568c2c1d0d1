#!/usr/bin/env bash
# Docker for the brokers, with images the project builds itself (no registry needed):
#
#   scripts/docker.sh install        Debian's docker.io + docker-compose (v1) + busybox-static,
#                                    when no Docker engine answers
#   eval "$(scripts/docker.sh start)"  reuse a daemon that answers, else start our own dockerd
#                                    (data root, socket, pidfile under $BUS_BROKER_HOME/docker);
#                                    prints: export DOCKER_HOST=...
#   scripts/docker.sh stop           stop the dockerd this script started (never another one)
#   scripts/docker.sh images         build the bus-nats, bus-kafka, bus-postgres, bus-seaweedfs images
#                                    (cached by input hash)
#   eval "$(scripts/docker.sh up)"   compose up nats, kafka, postgres and seaweedfs, poll their health
#                                    checks, make the S3 bucket; prints the export lines
#   scripts/docker.sh down           compose down -v, then check nothing of the project is left
#   scripts/docker.sh env            print the export lines (no start)
#
# Env: BUS_BROKER_HOME (~/.cache/bus-brokers), BUS_NATS_IMAGE (bus-nats:2.15.1),
#      BUS_KAFKA_IMAGE (bus-kafka:4.4.0), BUS_POSTGRES_IMAGE (bus-postgres:15), BUS_NATS_PORT (4222),
#      BUS_NATS_MONITOR_PORT (8222), BUS_KAFKA_PORT (9092), BUS_POSTGRES_PORT (5433),
#      BUS_SEAWEEDFS_IMAGE (bus-seaweedfs:4.53), BUS_S3_PORT (8333),
#      BUS_DOCKER_UP_TIMEOUT (180 s), BUS_DOCKER_STORAGE_DRIVER (overlay2, else vfs).
# Human messages go to stderr, export lines to stdout.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPT_DIR/.." && pwd)"
BUS_LOG_TAG=docker
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"
# shellcheck source=lib/docker-images.sh
. "$SCRIPT_DIR/lib/docker-images.sh"

DOCKER_HOME="$BUS_BROKER_HOME/docker"
OWN_SOCK="$DOCKER_HOME/docker.sock"
OWN_PIDFILE="$DOCKER_HOME/dockerd.pid"
OWN_LOG="$DOCKER_HOME/dockerd.log"
COMPOSE_FILE="$REPO_DIR/docker-compose.yml"
COMPOSE_PROJECT=bus-brokers
UP_TIMEOUT="${BUS_DOCKER_UP_TIMEOUT:-180}"

# docker_answers: the engine DOCKER_HOST (or the default socket) points at answers.
docker_answers() { command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; }

own_pid() {
  local pid
  pid="$(pidfile_pid "$OWN_PIDFILE")"
  pid_alive "$pid" dockerd && echo "$pid"
}

cmd_install() {
  local need=()
  command -v docker >/dev/null 2>&1 || need+=(docker.io)
  if ! docker_answers && ! command -v dockerd >/dev/null 2>&1; then need+=(docker.io); fi
  command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
  [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need+=(busybox-static)
  if [ "${#need[@]}" -gt 0 ]; then
    local t0; t0="$(now_ms)"
    # shellcheck disable=SC2046
    apt_install $(printf '%s\n' "${need[@]}" | sort -u)
    log "installed ${need[*]} in $(( $(now_ms) - t0 )) ms"
  fi
  log "$(docker --version 2>/dev/null || echo 'no docker CLI'); docker-compose $(docker-compose version --short 2>/dev/null || echo 'missing')"
}

# start: print the DOCKER_HOST to use; start our own dockerd when nothing answers.
cmd_start() {
  if [ -n "${DOCKER_HOST:-}" ] || [ -S /var/run/docker.sock ]; then
    if docker_answers; then
      log "reusing the running engine at ${DOCKER_HOST:-unix:///var/run/docker.sock}"
      echo "export DOCKER_HOST=${DOCKER_HOST:-unix:///var/run/docker.sock}"
      return 0
    fi
  fi
  export DOCKER_HOST="unix://$OWN_SOCK"
  if own_pid >/dev/null && docker_answers; then
    log "our dockerd already runs (pid $(own_pid), $DOCKER_HOST)"
    echo "export DOCKER_HOST=$DOCKER_HOST"
    return 0
  fi
  command -v dockerd >/dev/null 2>&1 || cmd_install
  [ "$(id -u)" = 0 ] || die "dockerd needs root (or start a Docker engine yourself and set DOCKER_HOST)"
  mkdir -p "$DOCKER_HOME/data" "$DOCKER_HOME/exec"
  rm -f "$OWN_PIDFILE" "$OWN_SOCK"
  # An empty config file of our own: /etc/docker/daemon.json is for the system daemon.
  echo '{}' >"$DOCKER_HOME/daemon.json"
  local driver="${BUS_DOCKER_STORAGE_DRIVER:-}" drivers pid t0
  if [ -n "$driver" ]; then drivers="$driver"; else drivers="overlay2 vfs"; fi
  for driver in $drivers; do
    t0="$(now_ms)"
    log "starting dockerd (storage driver $driver, data root $DOCKER_HOME/data, log $OWN_LOG)"
    echo "==== $(date -u +%FT%TZ) start driver=$driver" >>"$OWN_LOG"
    # Its own containerd (started by dockerd under the exec root), no system config file;
    # published ports bind 127.0.0.1 unless a port mapping says otherwise (testcontainers).
    nohup dockerd --data-root "$DOCKER_HOME/data" --exec-root "$DOCKER_HOME/exec" \
      --pidfile "$OWN_PIDFILE" -H "$DOCKER_HOST" --storage-driver "$driver" --ip 127.0.0.1 \
      --config-file "$DOCKER_HOME/daemon.json" >>"$OWN_LOG" 2>&1 </dev/null &
    pid=$!
    local end=$(( t0 + 60000 ))
    # `kill -0`, not pid_alive's name check: until the background subshell
    # has exec'd nohup and dockerd, its command line is this script's, and a
    # name check there took a starting daemon for a dead one (a CI rehearsal
    # then waited on the live daemon forever).
    until docker_answers; do
      kill -0 "$pid" 2>/dev/null || break
      [ "$(now_ms)" -ge "$end" ] && break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null && docker_answers; then
      log "dockerd ready in $(( $(now_ms) - t0 )) ms (pid $pid, $(docker info --format '{{.Driver}}' 2>/dev/null))"
      echo "export DOCKER_HOST=$DOCKER_HOST"
      return 0
    fi
    tail_log "$OWN_LOG" 15
    log "dockerd with storage driver $driver did not come up"
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f "$OWN_PIDFILE" "$OWN_SOCK"
  done
  die "could not start dockerd (log: $OWN_LOG)"
}

cmd_stop() {
  stop_pidfile "$OWN_PIDFILE" dockerd dockerd "${BUS_DOCKER_STOP_TIMEOUT:-30}"
}

own_or_running_host() {
  if [ -z "${DOCKER_HOST:-}" ] && [ -S "$OWN_SOCK" ] && own_pid >/dev/null; then
    export DOCKER_HOST="unix://$OWN_SOCK"
  fi
  docker_answers || die "no Docker engine answers (run: eval \"\$($0 start)\")"
}

compose() {
  BUS_NATS_IMAGE="$NATS_IMAGE" BUS_KAFKA_IMAGE="$KAFKA_IMAGE" BUS_POSTGRES_IMAGE="$POSTGRES_IMAGE" \
    BUS_SEAWEEDFS_IMAGE="$SEAWEEDFS_IMAGE" docker-compose -p "$COMPOSE_PROJECT" -f "$COMPOSE_FILE" "$@"
}

nats_port() { echo "${BUS_NATS_PORT:-4222}"; }
kafka_port() { echo "${BUS_KAFKA_PORT:-9092}"; }
postgres_port() { echo "${BUS_POSTGRES_PORT:-5433}"; }
s3_port() { echo "${BUS_S3_PORT:-8333}"; }
SERVICES=(nats kafka postgres seaweedfs)

cmd_env() {
  echo "export BUS_NATS_URL=nats://127.0.0.1:$(nats_port)"
  echo "export BUS_KAFKA_BROKERS=127.0.0.1:$(kafka_port)"
  echo "export BUS_POSTGRES_URL=postgres://bus:bus@127.0.0.1:$(postgres_port)/bus"
  echo "export BUS_S3_ENDPOINT=http://127.0.0.1:$(s3_port) BUS_S3_BUCKET=${BUS_S3_BUCKET:-bus-cold}"
}

# health SERVICE: the health status docker reports for the service's container.
health() {
  local id
  id="$(compose ps -q "$1" 2>/dev/null)"
  [ -n "$id" ] || { echo missing; return 0; }
  docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id" 2>/dev/null || echo missing
}

# up: compose v1 has no `up --wait`, so poll the health checks until both are healthy.
cmd_up() {
  own_or_running_host
  build_images >&2
  local p
  for p in "$(nats_port)" "$(kafka_port)" "${BUS_NATS_MONITOR_PORT:-8222}" "$(postgres_port)" "$(s3_port)"; do
    port_open 127.0.0.1 "$p" && die "port $p on 127.0.0.1 is already in use (set BUS_NATS_PORT / BUS_KAFKA_PORT / BUS_NATS_MONITOR_PORT / BUS_POSTGRES_PORT / BUS_S3_PORT)"
  done
  local t0 end s st all
  t0="$(now_ms)"; end=$(( t0 + UP_TIMEOUT * 1000 ))
  log "docker-compose up -d ${SERVICES[*]} (images $NATS_IMAGE, $KAFKA_IMAGE, $POSTGRES_IMAGE, $SEAWEEDFS_IMAGE)"
  compose up -d --no-build "${SERVICES[@]}" >&2 || die "docker-compose up failed"
  while :; do
    all=1; st=""
    for s in "${SERVICES[@]}"; do
      st="$st $s=$(health "$s")"
      [ "$(health "$s")" = healthy ] || all=0
    done
    [ "$all" = 1 ] && break
    if [ "$(now_ms)" -ge "$end" ] || printf '%s' "$st" | grep -qE '=(unhealthy|exited|dead|missing)'; then
      compose ps >&2 || true
      compose logs --tail 40 >&2 || true
      die "services not healthy after $(( ($(now_ms) - t0) / 1000 )) s:$st (run: $0 down)"
    fi
    sleep 1
  done
  log "healthy in $(( $(now_ms) - t0 )) ms:$st"
  # The cold tier's bucket (the gateway answers before the bucket can be made; the script waits).
  BUS_S3_PORT="$(s3_port)" "$SCRIPT_DIR/seaweedfs.sh" bucket >/dev/null
  cmd_env
}

# down: remove the containers, network and volumes, then prove nothing is left.
cmd_down() {
  own_or_running_host
  local t0 left
  t0="$(now_ms)"
  compose down -v --remove-orphans >&2 || die "docker-compose down failed"
  left="$(docker ps -aq --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")$(docker network ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")$(docker volume ls -q --filter "label=com.docker.compose.project=$COMPOSE_PROJECT")"
  [ -z "$left" ] || die "left behind after down: $left"
  log "down in $(( $(now_ms) - t0 )) ms; no container, network or volume of $COMPOSE_PROJECT left"
}

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  install) cmd_install ;;
  start)   cmd_start ;;
  stop)    cmd_stop ;;
  images)  own_or_running_host; build_images ;;
  up)      cmd_up ;;
  down)    cmd_down ;;
  env)     cmd_env ;;
  *)       usage ;;
esac

#!/usr/bin/env bash
# Native SeaweedFS serving S3 on loopback, for the cold tier's tests (#30, C24; no Docker).
#
#   scripts/seaweedfs.sh install       build `weed` from its Go module once, cache it in the broker home
#   scripts/seaweedfs.sh start [DIR]   start in background, wait for S3, create the bucket;
#                                      prints BUS_S3_ENDPOINT=... and BUS_S3_BUCKET=... on stdout
#   scripts/seaweedfs.sh stop          TERM by pidfile, KILL after a deadline, check it is gone
#   scripts/seaweedfs.sh env           prints: export BUS_S3_ENDPOINT=... BUS_S3_BUCKET=...
#   scripts/seaweedfs.sh status        exit 0 if running and S3 answers
#   scripts/seaweedfs.sh bucket        create the bucket on a server started elsewhere (Docker), once
#                                      it answers; prints the two lines `start` prints
#
# Env: BUS_S3_PORT (8333), BUS_SEAWEEDFS_MASTER_PORT (9333), BUS_SEAWEEDFS_VOLUME_PORT (8087),
#      BUS_SEAWEEDFS_FILER_PORT (8888) -- weed also listens on each port + 10000 (gRPC), keep
#      those free too; BUS_S3_BUCKET (bus-cold), BUS_SEAWEEDFS_VERSION (the Go pseudo-version),
#      BUS_SEAWEEDFS_BIN (use this binary), BUS_BROKER_HOME (~/.cache/bus-brokers),
#      BUS_SEAWEEDFS_START_TIMEOUT (120 s), BUS_SEAWEEDFS_STOP_TIMEOUT (15 s),
#      BUS_SEAWEEDFS_S3_CONFIG (an identities file: the server then takes only its keys, and the
#      script signs with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
# Human messages go to stderr, data lines to stdout. Without BUS_SEAWEEDFS_S3_CONFIG the server
# takes no credentials (no identities configured); it listens on 127.0.0.1 only.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUS_LOG_TAG=seaweedfs
# shellcheck source=lib/common.sh
. "$SCRIPT_DIR/lib/common.sh"

HOST=127.0.0.1
# The version checked in BROKERS.md ("An S3-compatible server here"): `weed version` 30GB 4.53.
VERSION="${BUS_SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
CACHE_DIR="$BUS_BROKER_HOME/seaweedfs-$VERSION"
CACHE_BIN="$CACHE_DIR/weed"
S3_PORT="${BUS_S3_PORT:-8333}"
MASTER_PORT="${BUS_SEAWEEDFS_MASTER_PORT:-9333}"
VOLUME_PORT="${BUS_SEAWEEDFS_VOLUME_PORT:-8087}"
FILER_PORT="${BUS_SEAWEEDFS_FILER_PORT:-8888}"
BUCKET="${BUS_S3_BUCKET:-bus-cold}"
START_TIMEOUT="${BUS_SEAWEEDFS_START_TIMEOUT:-120}"
PIDFILE="$BUS_BROKER_RUN/seaweedfs-$S3_PORT.pid"
LOGFILE="$BUS_BROKER_RUN/seaweedfs-$S3_PORT.log"
ENDPOINT="http://$HOST:$S3_PORT"

weed_bin() {
  if [ -n "${BUS_SEAWEEDFS_BIN:-}" ]; then echo "$BUS_SEAWEEDFS_BIN"; return 0; fi
  [ -x "$CACHE_BIN" ] && echo "$CACHE_BIN"
}

# cmd_install: `go install …@version` is refused (the module's go.mod has replace
# directives), so a scratch module requires it and builds the command. The Go module and
# build caches (GOMODCACHE, GOCACHE) make a second build on the same machine fast.
# -ldflags '-s -w' (no symbol table, no DWARF): 164 MB instead of 233 MB and a shorter link
# (12 s here with warm caches); `weed version` is unchanged. Not -trimpath: it changes the
# build cache's keys, so a machine whose caches were warmed without it compiles everything again.
cmd_install() {
  local bin
  if bin="$(weed_bin)"; then
    log "already installed: $bin"
    "$bin" version 2>/dev/null | head -n1
    return 0
  fi
  command -v go >/dev/null 2>&1 || die "go not found: SeaweedFS builds from its Go module (install Go >= 1.24, or set BUS_SEAWEEDFS_BIN)"
  local scratch t0
  scratch="$CACHE_DIR.build.$$"
  rm -rf "$scratch"; mkdir -p "$scratch"
  t0="$(now_ms)"
  log "building weed $VERSION in $scratch (about 10 min on two busy cores without Go caches; log $scratch/build.log)"
  if ! (
    cd "$scratch" &&
      go mod init x &&
      go get "github.com/seaweedfs/seaweedfs/weed@$VERSION" &&
      go build -ldflags='-s -w' -o weed github.com/seaweedfs/seaweedfs/weed
  ) >"$scratch/build.log" 2>&1; then
    tail_log "$scratch/build.log"; rm -rf "$scratch"; die "building weed failed"
  fi
  "$scratch/weed" version >/dev/null 2>&1 || { rm -rf "$scratch"; die "the built weed does not run"; }
  mkdir -p "$CACHE_DIR"
  mv -f "$scratch/weed" "$CACHE_BIN.tmp.$$"
  mv -f "$CACHE_BIN.tmp.$$" "$CACHE_BIN" # atomic: a half-copied binary is never cached
  rm -rf "$scratch"
  log "built $CACHE_BIN ($(du -h "$CACHE_BIN" | cut -f1)) in $(( ($(now_ms) - t0) / 1000 )) s"
  "$CACHE_BIN" version 2>/dev/null | head -n1
}

running_pid() {
  local pid
  pid="$(pidfile_pid "$PIDFILE")"
  pid_alive "$pid" weed && echo "$pid"
}

# master_leader: the master has won its (single-node) raft election. On a data directory
# kept from an earlier run it recovers the raft state and first answers `{"MaxVolumeId":N}`
# without `IsLeader` for ~17 s (measured here); the S3 gateway already answers GET / then,
# but a bucket PUT waits on the master and timed out (HTTP 000) -- the CI failure of 78b5b45.
master_leader() {
  curl -s --max-time 2 "http://$HOST:$MASTER_PORT/cluster/status" 2>/dev/null | grep -q '"IsLeader":true'
}

# healthy: the master leads and the S3 gateway answers a ListBuckets (anonymous, or signed
# when the server takes keys).
healthy() { master_leader && s3_curl -fsS -o /dev/null --max-time 2 "$ENDPOINT/" 2>/dev/null; }

# s3_curl ARGS...: curl against the S3 gateway. With BUS_SEAWEEDFS_S3_CONFIG (an identities file
# for -s3.config) the server takes only those keys, so the script signs its own requests with
# AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (SigV4; test servers only: the key is on curl's
# command line).
s3_curl() {
  if [ -n "${BUS_SEAWEEDFS_S3_CONFIG:-}" ]; then
    curl --aws-sigv4 "aws:amz:us-east-1:s3" \
      --user "${AWS_ACCESS_KEY_ID:?BUS_SEAWEEDFS_S3_CONFIG needs AWS_ACCESS_KEY_ID}:${AWS_SECRET_ACCESS_KEY:?and AWS_SECRET_ACCESS_KEY}" "$@"
  else
    curl "$@"
  fi
}

# ensure_bucket: PUT is idempotent on SeaweedFS for an existing bucket owned by us
# (it answers 409 BucketAlreadyExists/OwnedByYou; both mean the bucket is there).
# The PUT is retried until DEADLINE_MS (the start deadline): a gateway that is still finding
# its master answers nothing (HTTP 000) or 5xx for a while.
ensure_bucket() {
  local code deadline_ms="$1"
  while :; do
    code="$(s3_curl -s -o /dev/null -w '%{http_code}' --max-time 10 -X PUT "$ENDPOINT/$BUCKET")" || code=000
    case "$code" in
      200|409) break ;;
    esac
    [ "$(now_ms)" -ge "$deadline_ms" ] && { tail_log "$LOGFILE"; die "creating bucket $BUCKET at $ENDPOINT answered HTTP $code until the start deadline"; }
    sleep 0.5
  done
  # a fresh SeaweedFS may answer the PUT before the filer serves the bucket: wait for a listing
  local end=$(( $(now_ms) + 20000 ))
  until s3_curl -fsS -o /dev/null --max-time 2 "$ENDPOINT/$BUCKET?list-type=2&max-keys=1" 2>/dev/null; do
    [ "$(now_ms)" -ge "$end" ] && die "bucket $BUCKET does not list after 20 s"
    sleep 0.2
  done
}

cmd_start() {
  local dir bin pid p
  dir="${1:-$BUS_BROKER_RUN/seaweedfs-$S3_PORT/data}"
  command -v curl >/dev/null 2>&1 || apt_install curl ca-certificates
  mkdir -p "$BUS_BROKER_RUN"
  if pid="$(running_pid)"; then
    log "already running (pid $pid, S3 $ENDPOINT)"
  else
    rm -f "$PIDFILE"
    bin="$(weed_bin)" || { cmd_install >/dev/null; bin="$(weed_bin)"; }
    for p in "$S3_PORT" "$MASTER_PORT" "$VOLUME_PORT" "$FILER_PORT" \
      $(( MASTER_PORT + 10000 )) $(( VOLUME_PORT + 10000 )) $(( FILER_PORT + 10000 )); do
      port_open "$HOST" "$p" && die "port $p on $HOST is already in use by another process"
    done
    mkdir -p "$dir"
    log "starting $bin (S3 $ENDPOINT, master $MASTER_PORT, volume $VOLUME_PORT, filer $FILER_PORT, dir $dir, log $LOGFILE)"
    echo "==== $(date -u +%FT%TZ) start s3=$S3_PORT dir=$dir" >>"$LOGFILE"
    # -volume.max=0: volumes by free disk, not a fixed count of 8 (a test run creates several
    # collections); -master.volumeSizeLimitMB keeps each small on a shared disk.
    nohup "$bin" server -dir="$dir" -ip="$HOST" -ip.bind="$HOST" \
      -master.port="$MASTER_PORT" -master.volumeSizeLimitMB=64 \
      -volume.port="$VOLUME_PORT" -volume.max=0 \
      -filer -filer.port="$FILER_PORT" -s3 -s3.port="$S3_PORT" \
      ${BUS_SEAWEEDFS_S3_CONFIG:+-s3.config="$BUS_SEAWEEDFS_S3_CONFIG"} \
      >>"$LOGFILE" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$PIDFILE"
  fi
  local t0 end
  t0="$(now_ms)"; end=$(( t0 + START_TIMEOUT * 1000 ))
  until healthy; do
    if ! pid_alive "$pid" weed; then
      rm -f "$PIDFILE"; tail_log "$LOGFILE"; die "weed (pid $pid) exited during startup"
    fi
    if [ "$(now_ms)" -ge "$end" ]; then
      tail_log "$LOGFILE"; die "S3 not ready after ${START_TIMEOUT}s (pid $pid left running; run: $0 stop)"
    fi
    sleep 0.2
  done
  ensure_bucket "$end"
  log "ready in $(( $(now_ms) - t0 )) ms (pid $pid, rss $(rss_kb "$pid") KiB, bucket $BUCKET)"
  echo "BUS_S3_ENDPOINT=$ENDPOINT"
  echo "BUS_S3_BUCKET=$BUCKET"
}

# cmd_stop: weed once outlived a plain SIGTERM (BROKERS.md): stop_pidfile sends KILL after
# the deadline and fails if the pid is still there afterwards.
cmd_stop() {
  stop_pidfile "$PIDFILE" weed "seaweedfs:$S3_PORT" "${BUS_SEAWEEDFS_STOP_TIMEOUT:-15}"
}

cmd_status() {
  local pid
  if pid="$(running_pid)" && healthy; then
    log "running: pid $pid, S3 $ENDPOINT, rss $(rss_kb "$pid") KiB"
    return 0
  fi
  log "not running (S3 port $S3_PORT)"
  return 1
}

cmd_env() { echo "export BUS_S3_ENDPOINT=$ENDPOINT BUS_S3_BUCKET=$BUCKET"; }

cmd_bucket() {
  command -v curl >/dev/null 2>&1 || apt_install curl ca-certificates
  ensure_bucket $(( $(now_ms) + START_TIMEOUT * 1000 ))
  log "bucket $BUCKET at $ENDPOINT"
  echo "BUS_S3_ENDPOINT=$ENDPOINT"
  echo "BUS_S3_BUCKET=$BUCKET"
}

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

sub="${1:-}"; [ $# -gt 0 ] && shift
case "$sub" in
  install) cmd_install ;;
  start)   cmd_start "$@" ;;
  stop)    cmd_stop ;;
  env)     cmd_env ;;
  status)  cmd_status ;;
  bucket)  cmd_bucket ;;
  *)       usage ;;
esac

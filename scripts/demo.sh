#!/usr/bin/env bash
# The main job on the embedded default: provision a manifest, publish a few
# events (one of them twice, deduplicated by its UID), fetch them back.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dir="${BUS_DEMO_DIR:-$(mktemp -d)}"
export BUS_URL="file://$dir"
# The `bus` command is the bus-cli crate (the root package is the library).
cargo build -q --release -p bus-cli
bus="${CARGO_TARGET_DIR:-target}/release/bus"
$bus provision examples/topics.toml
printf '%s\n' '{"event":"start","n":1}' '{"event":"step","n":2}' '{"event":"stop","n":3}' \
  | $bus publish audit --key agent-1
$bus publish audit --key agent-1 --uid evt-42 '{"event":"audited","metadata":{"uid":"evt-42"}}'
$bus publish audit --key agent-1 --uid evt-42 '{"event":"audited","metadata":{"uid":"evt-42"}}'
$bus find audit --key agent-1 --uid evt-42
$bus fetch audit --key agent-1
$bus topics
echo "demo: data in $dir" >&2

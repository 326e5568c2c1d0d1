#!/usr/bin/env bash
# Crate boundaries (issue 16): a library user of `bus` with only the
# embedded backend compiles neither the CLI's dependencies, nor tokio, nor
# the benchmark references (bus-reference).
# Fails, naming the crate, when one of them is back in that build's tree.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tree="$(cargo tree -e normal -p bus --no-default-features --features embedded --prefix none)"
status=0
for crate in clap indicatif tokio bus-reference; do
  if grep -q "^$crate v" <<<"$tree"; then
    echo "check-boundaries.sh: \`bus\` with only the embedded backend depends on $crate:" >&2
    cargo tree -e normal -p bus --no-default-features --features embedded -i "$crate" >&2 || true
    status=1
  fi
done
[ "$status" = 0 ] && echo "check-boundaries.sh: bus --no-default-features --features embedded pulls none of clap, indicatif, tokio, bus-reference" >&2
exit "$status"

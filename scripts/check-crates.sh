#!/usr/bin/env bash
# The crates as a user receives them (issue #27), in CI after scripts/test.sh:
#   1. what `bus = "0.1"` compiles: its default tree has none of the CLI's
#      crates, no benchmark crate and no tokio;
#   2. each feature of the facade builds on its own, and with none;
#   3. `cargo doc --no-deps` of the workspace with warnings denied;
#   4. `cargo package` of every publishable crate, verified (each is built
#      from its packaged sources against the others' packages through a
#      local registry overlay; nothing is published).
# Prints how long each step took, for the CI time budget.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step_started=0
step() {
  now="$(date +%s)"
  [ "$step_started" = 0 ] || echo "check-crates.sh: ${step_name} took $((now - step_started)) s" >&2
  step_started="$now"
  step_name="$1"
  [ -z "$step_name" ] || echo "check-crates.sh: $step_name" >&2
}

# 1. The crate graph keeps bus-bench out of every published crate (it is
# `publish = false` with no version, so step 4 fails for any crate that
# depends on it) and the CLI's crates out of the facade (no `cli` feature
# anymore). It does not keep tokio out of the embedded default, a property
# of the feature graph (bus-embedded's `async`, or a backend adding it):
# that one is checked here, with the others as a net for a transitive pull.
step "the default tree of bus"
tree="$(cargo tree -e normal -p bus --prefix none)"
status=0
for crate in clap indicatif tokio bus-bench bus-cli opentelemetry cloudevents-sdk; do
  if grep -q "^$crate v" <<<"$tree"; then
    echo "check-crates.sh: \`bus\` with default features depends on $crate:" >&2
    cargo tree -e normal -p bus -i "$crate" >&2 || true
    status=1
  fi
done
[ "$status" = 0 ] || exit 1

# 2. A feature that only builds beside another (a `cfg` missing, an import
# only the other feature brings) shows here, not in the --all-features test.
for features in "" embedded nats kafka postgres async metrics otel cloudevents cold; do
  step "cargo check -p bus --no-default-features --features '$features'"
  cargo check -q -p bus --no-default-features --features "$features" --all-targets
done

# 3. Broken intra-doc links and the like, which `cargo test` does not see.
step "cargo doc --no-deps --workspace --all-features"
RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps --workspace --all-features

# 4. bus-bench and bus-testfs (the power-cut tests' FUSE filesystem, a
# path dev-dependency of bus-embedded that packaging drops) are the
# unpublished members (publish = false). A packaged
# member carries no [profile] (profiles live in the workspace root), so the
# verification builds would compile every dependency again unoptimized with
# full debug info; the workspace's dev profile, given here, lets them reuse
# what scripts/test.sh built. --allow-dirty: a local run with edits works.
step "cargo package --workspace --exclude bus-bench --exclude bus-testfs"
# The verification builds take each packaged member from a local registry
# that cargo unpacks under $CARGO_HOME/registry/src/-<hash of its path>/ and
# never unpacks again while that folder exists: a second run from the same
# checkout path (CI's, every landing) compiled the previous run's bus-core
# and failed on a trait method added since (E0407, CI of fd868c3). Remove
# the unpacked copies of this workspace's own crates first.
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
cargo metadata -q --no-deps --format-version 1 \
  | jq -r '.packages[] | "\(.name)-\(.version)"' \
  | while read -r unpacked; do
      rm -rf "$cargo_home"/registry/src/-*/"$unpacked"
    done
cargo package --workspace --exclude bus-bench --exclude bus-testfs --allow-dirty \
  --config 'profile.dev.debug="line-tables-only"' \
  --config 'profile.dev.package."*".opt-level=1' \
  --config 'profile.dev.package."*".debug=false'
step ""

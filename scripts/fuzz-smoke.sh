#!/usr/bin/env bash
# Fuzz smoke test: builds every cargo-fuzz target in fuzz/ (nightly,
# installing cargo-fuzz if missing) and runs each for a few seconds over its
# committed corpus (fuzz/corpus/<target>, which holds the regression inputs
# too). Fails on any crash. New inputs go to a scratch corpus, so the
# committed one stays as it is.
#
#   scripts/fuzz-smoke.sh            # every target, 5 s each
#   FUZZ_SECONDS=60 scripts/fuzz-smoke.sh recovery frame_decode
#   FUZZ_CORE=1 scripts/fuzz-smoke.sh  # without the NATS and Kafka record and
#                                      # option targets, whose nightly build of
#                                      # async-nats and librdkafka is most of
#                                      # the cold cost (what CI runs)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${FUZZ_SECONDS:-5}"
# cargo-fuzz builds in fuzz/target; a CARGO_TARGET_DIR meant for the main
# workspace would mix the two builds.
unset CARGO_TARGET_DIR

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz-smoke.sh: needs the nightly toolchain (rustup toolchain install nightly)" >&2
    exit 1
fi
# cargo-fuzz from PATH, else built once per broker home (about 50 s on two cores), as the
# brokers' binaries are cached there.
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    fuzz_root="${BUS_BROKER_HOME:-${HOME:-/root}/.cache/bus-brokers}/cargo-fuzz-0.13.2"
    [ -x "$fuzz_root/bin/cargo-fuzz" ] \
        || cargo install cargo-fuzz --version 0.13.2 --locked --root "$fuzz_root"
    export PATH="$fuzz_root/bin:$PATH"
fi

# No sanitizer: the workspace forbids unsafe code, so ASAN would only
# watch the dependencies' unsafe code, at about twice the cost per run.
flags=(--sanitizer none)
if [ "${FUZZ_CORE:-0}" = 1 ]; then
    flags+=(--no-default-features)
fi
cargo +nightly fuzz build "${flags[@]}"

if [ "$#" -gt 0 ]; then
    targets=("$@")
elif [ "${FUZZ_CORE:-0}" = 1 ]; then
    # The targets fuzz/Cargo.toml builds without its nats/kafka features.
    mapfile -t targets < <(cargo +nightly fuzz list | grep -Ev '^(nats|kafka)_')
else
    mapfile -t targets < <(cargo +nightly fuzz list)
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
    mkdir -p "$scratch/$target" "fuzz/corpus/$target"
    echo "fuzz-smoke.sh: $target for ${seconds}s" >&2
    log="$scratch/$target.log"
    if ! cargo +nightly fuzz run "${flags[@]}" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "fuzz-smoke.sh: $target FAILED (the crashing input is under fuzz/artifacts/$target)" >&2
        exit 1
    fi
    grep -E $'^(#[0-9]+\tDONE|stat::number_of_executed_units)' "$log" >&2 || true
done
echo "fuzz-smoke.sh: ${#targets[@]} targets passed" >&2

# shellcheck shell=bash
# The workspace's test binaries, built once and run without cargo (sourced, not run).
#
# Every CI script runs tests from one build, `cargo test --workspace --all-features`: a
# `cargo test -p CRATE` unifies features differently and recompiles dependencies (about 4 min
# on two cores). test_binaries builds (or finds, when test.sh built them already) every test
# target and lists it; run_binary runs one the way `cargo test` does (from its crate's
# directory); run_lane runs a list of them one after another.

# test_binaries OUT [CARGO ARGS]: build every test target of the workspace (no run) and
# write one line per binary to OUT: crate, crate directory, target name, executable (tabs).
# With BUS_TEST_BINS naming such a list already made (.ci/run makes one after test.sh, so the
# scripts after it run no cargo command beside scripts/check-crates.sh), that list is copied.
test_binaries() {
  local out="$1"; shift
  if [ -n "${BUS_TEST_BINS:-}" ] && [ -s "$BUS_TEST_BINS" ]; then
    cp "$BUS_TEST_BINS" "$out"
    return 0
  fi
  cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics "$@" \
    | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test)
             | [(.manifest_path | rtrimstr("/Cargo.toml")), .target.name, .executable]
             | @tsv' \
    | while IFS=$'\t' read -r dir name exe; do
        printf '%s\t%s\t%s\t%s\n' "$(crate_name "$dir")" "$dir" "$name" "$exe"
      done >"$out"
  [ -s "$out" ] || { echo "test-bins: no test binary found" >&2; return 1; }
}

# crate_name DIR: the package name in DIR/Cargo.toml.
crate_name() {
  sed -n '/^\[package\]/,/^\[/{s/^name *= *"\([^"]*\)".*/\1/p}' "$1/Cargo.toml" | head -n1
}

# binary_of LIST CRATE TARGET: the executable of CRATE's test target TARGET in LIST.
binary_of() {
  awk -F'\t' -v c="$2" -v t="$3" '$1 == c && $3 == t { print $4; found = 1 } END { exit !found }' "$1" \
    || { echo "test-bins: no test target $3 in $2" >&2; return 1; }
}

# run_binary LIST CRATE TARGET [ARGS]: run one test binary from its crate's directory.
run_binary() {
  local list="$1" crate="$2" target="$3" exe dir; shift 3
  exe="$(binary_of "$list" "$crate" "$target")" || return 1
  dir="$(awk -F'\t' -v c="$crate" '$1 == c { print $2; exit }' "$list")"
  (cd "$dir" && "$exe" "$@")
}

# run_lane LIST LOG: run every binary of LIST (lines as test_binaries writes them) one after
# another, from its crate's directory, into LOG; a failure does not stop the others. Returns
# the number of binaries that failed.
run_lane() {
  local list="$1" log="$2" failed=0 t0
  while IFS=$'\t' read -r crate dir name exe; do
    printf '\n==== %s %s (%s)\n' "$crate" "$name" "$exe" >>"$log"
    t0="$(date +%s)"
    if (cd "$dir" && "$exe" </dev/null) >>"$log" 2>&1; then
      printf '==== %s %s passed in %s s\n' "$crate" "$name" "$(( $(date +%s) - t0 ))" >>"$log"
    else
      printf '==== %s %s FAILED in %s s\n' "$crate" "$name" "$(( $(date +%s) - t0 ))" >>"$log"
      failed=$((failed + 1))
    fi
  done <"$list"
  return "$failed"
}

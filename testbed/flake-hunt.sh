#!/usr/bin/env bash
# Reruns test binaries until their flakes show: each chosen binary RUNS
# times, PARALLEL binaries at once (two by default, so that each run shares
# the machine with another as a loaded CI machine would), then a table per
# binary: runs, failures, and each failure's first panic line. Logs go to
# target/flake-hunt/<binary>/<run>.log.
#
#   testbed/flake-hunt.sh [-n RUNS] [-j PARALLEL] [FILTER...] [-- TEST ARGS...]
#
# FILTER picks binaries whose name (<package>/<target>, as the table prints
# them: dlock-mysql/it, dlock-core/lib) contains it; none picks all. TEST
# ARGS go to every run (a test-name filter, `--exact`, `--skip x`).
#
#   testbed/flake-hunt.sh -n 10 dlock-mysql/it -- faults::
#   testbed/flake-hunt.sh -n 10                  # every binary of the workspace
#
# Exits 1 when any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10
parallel=2
filters=()
test_args=()
while [ $# -gt 0 ]; do
  case $1 in
    -n) runs=$2; shift 2 ;;
    -j) parallel=$2; shift 2 ;;
    --) shift; test_args=("$@"); break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) filters+=("$1"); shift ;;
  esac
done

# The test image is built once here, not inside the first runs that race for it.
export DLOCK_TEST_IMAGE=${DLOCK_TEST_IMAGE:-$(testbed/build-image.sh)}
# A proc-macro crate's test binary links the toolchain's libstd
# dynamically; `cargo test` puts the sysroot's lib folder on the library
# path for it, and so does this.
export LD_LIBRARY_PATH="$(rustc --print target-libdir)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# As `cargo test` runs them (see .cargo/config.toml).
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-$(sed -n 's/^RUST_TEST_THREADS *= *"\([0-9]*\)".*/\1/p' .cargo/config.toml)}

# name <TAB> executable <TAB> package folder, one line a test binary.
list=$(cargo test --workspace --no-run --message-format=json 2>/dev/null | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    name = t["name"] if t["kind"] != ["lib"] else "lib"
    pkg = os.path.dirname(m["manifest_path"])
    exe = m["executable"]
    print(f"{os.path.basename(pkg)}/{name}\t{exe}\t{pkg}")
')

chosen=()
while IFS=$'\t' read -r name exe dir; do
  keep=${#filters[@]}
  if [ "$keep" -gt 0 ]; then
    keep=0
    for f in "${filters[@]}"; do [[ $name == *"$f"* ]] && keep=1; done
  else
    keep=1
  fi
  [ "$keep" = 1 ] && chosen+=("$name"$'\t'"$exe"$'\t'"$dir")
done <<<"$list"
[ ${#chosen[@]} -gt 0 ] || { echo "flake-hunt: no test binary matches: ${filters[*]}" >&2; exit 2; }

out=target/flake-hunt
rm -rf "$out"
# One job a line: run number, then the binary's line; runs interleave so that
# each binary meets the others.
jobs=$(for r in $(seq 1 "$runs"); do for c in "${chosen[@]}"; do printf '%s\t%s\n' "$r" "$c"; done; done)

one() {
  local run=$1 name=$2 exe=$3 dir=$4; shift 4
  local log="$PWD/target/flake-hunt/$name/$run.log"
  mkdir -p "$(dirname "$log")"
  local started=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR=$dir "$exe" "$@") >"$log" 2>&1 || rc=$?
  echo "rc=$rc seconds=$((SECONDS - started))" >>"$log"
  printf '%-32s run %2s: %s in %ss\n' "$name" "$run" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$((SECONDS - started))"
}
export -f one

printf '%s\n' "$jobs" | while IFS=$'\t' read -r run name exe dir; do
  printf '%s\0%s\0%s\0%s\0' "$run" "$name" "$exe" "$dir"
  for a in "${test_args[@]+"${test_args[@]}"}"; do printf '%s\0' "$a"; done
  printf '\n'
done | tr -d '\n' | xargs -0 -n $((4 + ${#test_args[@]})) -P "$parallel" bash -c 'one "$@"' _

echo
printf '| binary | runs | failures | slowest | first panic line of each failure |\n|---|---:|---:|---:|---|\n'
failed=0
for c in "${chosen[@]}"; do
  name=${c%%$'\t'*}
  n=0 bad=0 slowest=0 lines=""
  for log in "$out/$name"/*.log; do
    n=$((n + 1))
    s=$(sed -n 's/^rc=[0-9]* seconds=\([0-9]*\)$/\1/p' "$log")
    [ "${s:-0}" -gt "$slowest" ] && slowest=$s
    if ! grep -q '^rc=0 ' "$log"; then
      bad=$((bad + 1))
      first=$(grep -m1 -A1 "panicked at" "$log" | tail -n1 | cut -c1-160)
      test=$(grep -m1 -o "^thread '[^']*'" "$log" | cut -d"'" -f2)
      lines+="${lines:+<br>}run $(basename "$log" .log): ${test:-?}: ${first:-$(tail -n2 "$log" | head -n1 | cut -c1-160)}"
    fi
  done
  failed=$((failed + bad))
  printf '| %s | %s | %s | %ss | %s |\n' "$name" "$n" "$bad" "$slowest" "$lines"
done
[ "$failed" = 0 ]

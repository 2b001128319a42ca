#!/usr/bin/env bash
# Fuzzes every file reader: tools/fuzz.sh SECONDS [TARGET...]
# Builds the libFuzzer targets in build-fuzz (clang-19, AddressSanitizer +
# UBSan; CMake option SNUG_BUILD_FUZZERS), writes their seed corpus with
# snug's own writers (make_seeds), then runs each target (all of them unless
# named) for SECONDS and prints per target the executions, the coverage
# (cov: edges, ft: features), the corpus and the findings. Exits 1 when any
# target found something: a crash, a sanitizer report, an exception other
# than snug::Error, an error message that does not name the file, an
# allocation over 64 MiB (-malloc_limit_mb; inputs are a few KiB), or an
# input that takes over 10 s (-timeout). The input that did it is saved under
# build-fuzz/findings/<target>/; replay it with
#   SNUG_FUZZ_VERBOSE=1 build-fuzz/tests/fuzz/fuzz_<target> FILE
# and commit it to tests/data/fuzz_regressions/<target>/ with its expected
# message in tests/host/fuzz_regression_test.cpp once the reader is fixed.
# The corpus grows in build-fuzz/corpus/<target>/ from run to run.
# Environment: SNUG_FUZZ_PARALLEL (targets at a time, default 1),
# SNUG_FUZZ_JOBS (build jobs, default nproc), SNUG_FUZZ_CXX (default clang++-19).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: tools/fuzz.sh SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
all=(llmc_model token_file tokenizer safetensors hf_import hf_llama state_file)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
parallel=${SNUG_FUZZ_PARALLEL:-1}
cxx=${SNUG_FUZZ_CXX:-clang++-19}
build=build-fuzz

tools/deps.sh
if ! command -v "$cxx" >/dev/null; then
  echo "fuzz.sh needs $cxx (Debian: apt-get install clang-19 libclang-rt-19-dev)" >&2
  exit 1
fi
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSNUG_BUILD_FUZZERS=ON -DSNUG_BUILD_TESTS=OFF -DSNUG_BUILD_EXAMPLES=OFF -DSNUG_BUILD_BENCHMARKS=OFF \
  -DSNUG_WITH_CUDA=OFF -DSNUG_USE_CBLAS=OFF >/dev/null
cmake --build "$build" -j"${SNUG_FUZZ_JOBS:-$(nproc)}"
rm -rf "$build/seeds"
"$build/tests/fuzz/make_seeds" "$build/seeds"
echo "== built and seeded in $(( $(date +%s) - start )) s"

# Stack traces with UBSan's reports; scratch files in a directory of their
# own (on a RAM disk when there is one), removed at the end even when a target
# crashed and left its files behind.
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
scratch_parent=${TMPDIR:-/tmp}
if [ -z "${TMPDIR:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then scratch_parent=/dev/shm; fi
TMPDIR=$(mktemp -d "$scratch_parent/snug-fuzz.XXXXXX")
export TMPDIR
trap 'rm -rf "$TMPDIR"' EXIT

dict_of() {
  case $1 in
    llmc_model|token_file|tokenizer) echo tests/fuzz/dict/llmc.dict ;;
    *) echo "tests/fuzz/dict/$1.dict" ;;
  esac
}

run_one() {
  local t=$1
  local corpus=$build/corpus/$t findings=$build/findings/$t log=$build/logs/$t.log
  mkdir -p "$corpus" "$findings" "$build/logs"
  rm -f "$findings"/*
  local extra=()
  [ -d "tests/data/fuzz_regressions/$t" ] && extra+=("tests/data/fuzz_regressions/$t")
  local rc=0
  "$build/tests/fuzz/fuzz_$t" "$corpus" "$build/seeds/$t" "${extra[@]}" \
    -dict="$(dict_of "$t")" -max_total_time="$seconds" -timeout=10 \
    -malloc_limit_mb=64 -rss_limit_mb=2048 -use_value_profile=1 \
    -artifact_prefix="$findings/" -print_final_stats=1 >"$log" 2>&1 || rc=$?
  echo "$rc" >"$build/logs/$t.rc"
}

running=0
for t in "${targets[@]}"; do
  if [ ! -x "$build/tests/fuzz/fuzz_$t" ]; then
    echo "no fuzz target '$t' (targets: ${all[*]})" >&2
    exit 2
  fi
  echo "== fuzzing $t for $seconds s"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
printf '\n%-12s %12s %8s %8s %8s %10s %9s  %s\n' target executions exec/s cov ft corpus rss_mb findings
for t in "${targets[@]}"; do
  log=$build/logs/$t.log
  rc=$(cat "$build/logs/$t.rc")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([^ ]*\).*/\1/p' <<<"$last")
  [ -z "$execs" ] && execs=$(sed -n 's/^#\([0-9]*\).*/\1/p' <<<"$last")
  eps=$(( ${execs:-0} / (seconds > 0 ? seconds : 1) ))
  found=$(find "$build/findings/$t" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -ne 0 ]; then
    status=1
    what=$(grep -m1 -E '==snug-fuzz== FINDING|ERROR: (libFuzzer|AddressSanitizer)|runtime error' "$log" || echo "exit code $rc")
    printf '%-12s %12s %8s %8s %8s %10s %9s  %s\n' "$t" "${execs:-?}" "$eps" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
      "${rss:-?}" "$found: ${what}"
    find "$build/findings/$t" -type f -printf '             %p\n'
  else
    printf '%-12s %12s %8s %8s %8s %10s %9s  %s\n' "$t" "$execs" "$eps" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
      "${rss:-?}" 0
  fi
done
echo "== fuzz.sh done in $(( $(date +%s) - start )) s (logs: $build/logs/)"
exit "$status"

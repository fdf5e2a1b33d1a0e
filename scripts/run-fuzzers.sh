#!/bin/sh
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan) into build-fuzz/ and runs each
# for SECONDS (default 60) from its seed corpus (fuzz/corpus/<target>/, read only; what a run
# adds goes to build-fuzz/corpus/<target>/). Every input of the committed corpus runs first, so
# a regression on a known input fails the same way every time; then libFuzzer mutates, from a
# fixed -seed (FSDPP_FUZZ_SEED, default 1) so a CI run can be repeated. Fails if any target
# crashes, leaks, times out on an input (-timeout, default 10 s) or trips a sanitizer; the input
# is saved as build-fuzz/artifacts/<target>-crash-<sha1> and printed in base64, so it survives
# a CI log (reproduce: base64 -d > FILE; build-fuzz/<target> FILE).
# Debian 12 (clang 14), against the libtorch scripts/libtorch.sh names (PyTorch's 2.15 from PyPI
# by default). See docs/fuzzing.md.
#   scripts/run-fuzzers.sh [SECONDS] [TARGET...]
# Environment: FSDPP_FUZZ_BUILD_DIR (build-fuzz), FSDPP_FUZZ_CXX (clang++-14 or clang++),
# FSDPP_FUZZ_TIMEOUT (10), FSDPP_FUZZ_SEED (1; 0 = random), FSDPP_FUZZ_ARGS (more libFuzzer
# flags, e.g. -jobs=2 -workers=2).
set -eu
cd "$(dirname "$0")/.."
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=${*:-"metadata_fuzzer safetensors_fuzzer checkpoint_fuzzer"}
build=${FSDPP_FUZZ_BUILD_DIR:-build-fuzz}
cxx=${FSDPP_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || echo clang++)}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}

scripts/install-deps.sh clang-14 libclang-rt-14-dev llvm-14  # libFuzzer + sanitizers, llvm-symbolizer
. scripts/libtorch.sh
# The build alone holds the global build lock (scripts/build.sh), not the runs.
start=$(date +%s)
(
  exec 9>/tmp/fsdpp-build.lock
  flock 9
  fsdpp_configure -S fuzz -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
  cmake --build "$build" -j2
)
echo "run-fuzzers: built in $(( $(date +%s) - start )) s"

# halt_on_error and abort: any ASan or UBSan report ends the run as a crash, with the input saved.
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/fuzz/lsan.supp:print_suppressions=0}
# The targets' scratch directories (fuzz/scratch_dir.cpp) go in a directory of this run,
# removed at the end: a target that crashes or is killed skips their atexit cleanup. In memory
# (/dev/shm) when there is one: checkpoint_fuzzer saves and fsyncs, which on a busy disk could
# pass the per-input timeout.
scratch_root=/dev/shm
[ -d "$scratch_root" ] && [ -w "$scratch_root" ] || scratch_root="$(pwd)/$build"
export TMPDIR="$(mktemp -d "$scratch_root/fsdpp-fuzz-XXXXXX")"
trap 'rm -rf "$TMPDIR"' EXIT
failed=""
for t in $targets; do
  case $t in
    metadata_fuzzer) dict=fuzz/dict/metadata.dict ;;
    safetensors_fuzzer) dict=fuzz/dict/safetensors.dict ;;
    *) dict=fuzz/dict/checkpoint.dict ;;
  esac
  mkdir -p "$build/corpus/$t" "$build/artifacts" "$build/logs"
  log="$build/logs/$t.log"
  echo "run-fuzzers: $t for $seconds s (log: $log)"
  # shellcheck disable=SC2086
  if "$build/$t" -max_total_time="$seconds" -timeout="${FSDPP_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 \
      -seed="${FSDPP_FUZZ_SEED:-1}" \
      -max_len=65536 -print_final_stats=1 -dict="$dict" -artifact_prefix="$build/artifacts/$t-" \
      ${FSDPP_FUZZ_ARGS:-} "$build/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    echo "run-fuzzers: $t ok: $(grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" | tr '\n' ' ')"
    grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 || true
  else
    echo "run-fuzzers: $t FAILED; the end of its log:" >&2
    tail -n 60 "$log" >&2
    for artifact in "$build/artifacts/$t-"*; do
      [ -f "$artifact" ] || continue
      echo "run-fuzzers: $artifact, in base64:" >&2
      base64 "$artifact" >&2
    done
    failed="$failed $t"
  fi
done
echo "run-fuzzers: $(( $(date +%s) - start )) s in all"
if [ -n "$failed" ]; then
  echo "run-fuzzers: failed:$failed" >&2
  exit 1
fi

#!/bin/sh
# Builds the library and the checkpoint tests with ASan + UBSan (gcc, -DFSDPP_SANITIZE=ON) into
# build-asan/ and runs them: any sanitizer report fails the test that made it. Only the
# checkpoint and safetensors test sources are compiled (FSDPP_TEST_SOURCES_MATCHING); no
# examples or benchmarks. Its cost is in docs/fuzzing.md.
#   scripts/run-sanitized-tests.sh [CTEST_REGEX]     (default '^Checkpoint|Safetensors')
set -eu
cd "$(dirname "$0")/.."
regex=${1:-^Checkpoint|Safetensors}
build=${FSDPP_ASAN_BUILD_DIR:-${FSDPP_BUILD_DIR:-build}-asan}  # build-debian13-asan/ under in-debian13.sh
. scripts/libtorch.sh
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
start=$(date +%s)
(
  exec 9>/tmp/fsdpp-build.lock
  flock 9
  # -O1, as ASan's documentation advises: against libtorch 2.15's heavier headers the -O2 build
  # took 626 s of a cold CI run (docs/fuzzing.md).
  fsdpp_configure -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DFSDPP_SANITIZE=ON -DFSDPP_BUILD_BENCH=OFF \
    -DFSDPP_BUILD_EXAMPLES=OFF -DFSDPP_TEST_SOURCES_MATCHING='/test_checkpoint|safetensors' >/dev/null
  cmake --build "$build" -j2 --target fsdpp_tests fsdpp-ckpt
)
built=$(date +%s)
echo "run-sanitized-tests: built in $((built - start)) s"
# libtorch is not instrumented; its one-time allocations that live until exit are not fsdpp's
# leaks (fuzz/lsan.supp names them).
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1:abort_on_error=1:detect_leaks=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(pwd)/fuzz/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:abort_on_error=1:print_stacktrace=1}
status=0
(cd "$build" && ctest -R "$regex" --no-tests=error --output-on-failure -j2) || status=$?
echo "run-sanitized-tests: tests ran in $(( $(date +%s) - built )) s, $(( $(date +%s) - start )) s in all"
exit $status

#!/bin/sh
# Configures and builds into ./build (or $FSDPP_BUILD_DIR: scripts/in-debian13.sh sets
# build-debian13) against the libtorch scripts/libtorch.sh names, RelWithDebInfo, with ccache when
# present: everything, or only the TARGETs given (scripts/run-main-job.sh builds just its own).
# One build at a time: builds on either libtorch, from any checkout, take one lock
# (in-debian13.sh shares /tmp), since two at once swamp a 2-core machine.
#   scripts/build.sh [TARGET...]
set -eu
cd "$(dirname "$0")/.."
. scripts/libtorch.sh
build=${FSDPP_BUILD_DIR:-build}
# ccache hits across clones and worktrees (paths relative to the checkout; debug info then names
# the clone that first compiled a file).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
# Without this ccache caches nothing that uses a precompiled header (every source here does).
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
mkdir -p "$build"
exec 9>/tmp/fsdpp-build.lock
flock 9
# Line tables only (-g1): full debug info makes a libtorch translation unit 1.7x slower to compile
# (tests/dist/test_fully_shard.cpp without its precompiled header: -O2 -g 58.8 s, -O2 -g1 34.5 s);
# -g1 keeps file:line in backtraces and sanitizer reports. run-fuzzers.sh and
# run-sanitized-tests.sh pass the same flags.
fsdpp_configure -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" >/dev/null
targets=""
for t in "$@"; do targets="$targets --target $t"; done
# shellcheck disable=SC2086
cmake --build "$build" -j2 $targets

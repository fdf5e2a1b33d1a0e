#!/bin/sh
# Configures and builds everything (RelWithDebInfo, ccache when present) into ./build, or into
# $FSDPP_BUILD_DIR (scripts/in-debian13.sh sets build-debian13). One build at a time: builds on
# either libtorch, from any checkout, take one lock (in-debian13.sh shares /tmp), since two at
# once swamp a 2-core machine.
set -eu
cd "$(dirname "$0")/.."
build=${FSDPP_BUILD_DIR:-build}
mkdir -p "$build"
exec 9>/tmp/fsdpp-build.lock
flock 9
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j2

#!/bin/sh
# README command 2: install, build, and run the whole test suite.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build=${FSDPP_BUILD_DIR:-build}
echo "run-tests: $(scripts/describe-platform.sh)"
cd "$build" && ctest --output-on-failure -j2

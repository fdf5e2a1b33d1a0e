#!/bin/sh
# README command 1: install, build, and run the main job on 4 local ranks.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/tools/fsdpp-run --nproc-per-node 4 build/examples/collectives_check

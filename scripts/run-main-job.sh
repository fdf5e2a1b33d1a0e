#!/bin/sh
# README command 1: install, build, and run the main job (FSDP training of a small
# transformer, checked against single-process training) on 4 local ranks.
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
build/tools/fsdpp-run --nproc-per-node 4 build/examples/train_transformer

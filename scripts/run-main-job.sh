#!/bin/sh
# README command 1: install, build, and run the main job: train_gpt (examples/train_gpt) trains
# a small GPT on about 2 MB of English text (scripts/make-corpus.sh) on 4 local ranks for a few
# minutes, with checkpoints, and ends with model.safetensors, a text sample and a summary.
# Extra arguments go to train_gpt (e.g. --steps 200); the run folder is <build>/main-job (build/,
# or $FSDPP_BUILD_DIR: build-debian13/ under scripts/in-debian13.sh).
set -eu
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh fsdpp-run train_gpt  # what the job runs, not the tests
build=${FSDPP_BUILD_DIR:-build}
run=$build/main-job
rm -rf "$run"
mkdir -p "$run"
scripts/make-corpus.sh "$run/corpus.txt"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # one thread per rank: 4 ranks share the cores
echo "main job: $(scripts/describe-platform.sh)"
"$build/tools/fsdpp-run" --nproc-per-node 4 "$build/examples/train_gpt" \
  --data "$run/corpus.txt" --ckpt-dir "$run/ckpt" \
  --layers 4 --dim 128 --heads 4 --seq 64 --batch 16 --steps 600 --warmup 50 --lr 2e-3 --min-lr 2e-4 \
  --log-every 50 --eval-every 150 --eval-batches 8 --ckpt-every 150 --keep 2 --prompt "The " "$@"

#!/bin/sh
# README command 1: install, build, and run the main job: train_gpt (examples/train_gpt) trains
# a small Llama-architecture model (examples/train_gpt/main-job-config.json) on about 2 MB of
# English text (scripts/make-corpus.sh) with a byte-level BPE tokenizer trained on that text
# (scripts/train-tokenizer.py) on 4 local ranks for a few minutes, with checkpoints, metrics and
# TensorBoard events, and ends with a Hugging Face directory (<run>/hf), a text sample, the loss
# curves' picture (<run>/ckpt/loss-curve.svg) and a summary. Where Python's `tokenizers` is
# missing (Debian's 2.6 leg) the tokens are the text's bytes and the shape flags give the model.
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
. scripts/libtorch.sh
if "$FSDPP_PYTHON" -c 'import tokenizers, transformers' 2>/dev/null; then
  "$FSDPP_PYTHON" scripts/train-tokenizer.py "$run/corpus.txt" "$run/tokenizer" 2048
  model="--config examples/train_gpt/main-job-config.json --tokenizer $run/tokenizer"
else
  echo "main job: $FSDPP_PYTHON has no tokenizers: byte tokens, the model from the shape flags"
  model="--layers 4 --dim 128 --heads 4 --kv-heads 2"
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # one thread per rank: 4 ranks share the cores
echo "main job: $(scripts/describe-platform.sh)"
# shellcheck disable=SC2086
"$build/tools/fsdpp-run" --nproc-per-node 4 "$build/examples/train_gpt" \
  --data "$run/corpus.txt" --ckpt-dir "$run/ckpt" $model --export-hf "$run/hf" \
  --metrics-file "$run/metrics.jsonl" --tensorboard "$run/tensorboard" \
  --seq 64 --batch 16 --steps 600 --warmup 50 --lr 2e-3 --min-lr 2e-4 \
  --log-every 50 --eval-every 150 --eval-batches 8 --ckpt-every 150 --keep 2 --prompt "The " "$@"

#!/bin/sh
# Hugging Face directory benchmark (issue 48): a 1.16 GB float32 Llama (20 layers, hidden 1024,
# GQA 16/4 heads, vocabulary 32000, untied) exported from a deferred FSDP model and loaded back
# into a fresh one, at N = 1, 2, 4 ranks (bench_huggingface under fsdpp-run), shards of 256 MiB.
# The load follows the export at once, so it reads from the page cache (as a job that has just
# downloaded a model does); the disk's speed is bench/run_checkpoint_bench.sh's. Usage: bench/run_huggingface_bench.sh [build-dir]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
work=$(mktemp -d /tmp/fsdpp-hf-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
cat >"$work/config.json" <<'JSON'
{"model_type": "llama", "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
 "num_hidden_layers": 20, "num_attention_heads": 16, "num_key_value_heads": 4,
 "rope_theta": 500000.0, "tie_word_embeddings": false}
JSON
sh "$here/../scripts/describe-platform.sh"
for n in 1 2 4; do
  rm -rf "$work/hf"
  OPENBLAS_NUM_THREADS=1 "$build/tools/fsdpp-run" --nproc-per-node "$n" -- \
    "$build/bench/bench_huggingface" --config "$work/config.json" --dir "$work/hf" --max-shard-mib 256 \
    | grep -E 'export:|load'
  echo "   (directory: $(du -sm "$work/hf" | cut -f1) MiB, $(ls "$work/hf" | wc -l) files)"
done

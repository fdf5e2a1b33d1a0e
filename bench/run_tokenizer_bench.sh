#!/bin/sh
# Tokenizer benchmark (issue 49): fsdpp::Tokenizer against Python's tokenizers and sentencepiece,
# one thread each, on the tokenizer tests' 1.3 MB text (many scripts, emoji, invalid UTF-8), with
# the Llama 3 style byte-level BPE and the SentencePiece BPE that tests/tokenizer/tokenizer_reference.py
# trains. Each side encodes the whole file in one call and then line by line; best of 3.
# Usage: bench/run_tokenizer_bench.sh [build-dir]   (Python: the build's FSDPP_PYTHON, or $PYTHON)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
python=${PYTHON:-$(sed -n 's/^FSDPP_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt")}
work=$(mktemp -d /tmp/fsdpp-tokenizer-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
"$python" "$here/../tests/tokenizer/tokenizer_reference.py" "$work" >/dev/null
sh "$here/../scripts/describe-platform.sh"
for tok in llama3_bpe spm_bpe; do
  echo "== $tok: fsdpp (C++)"
  "$build/bench/bench_tokenizer" "$work/$tok" "$work/corpus.bin"
  echo "== $tok: Python"
  "$python" "$here/bench_tokenizer.py" "$work/$tok" "$work/corpus.bin"
done

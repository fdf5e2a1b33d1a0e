#!/bin/sh
# Regenerates fuzz/corpus/ from scratch: real checkpoints and safetensors files saved by fsdpp
# (save_seed_checkpoints.cpp, compiled against the main build in ./build) plus hand-broken
# variants (make_corpus.py). Inputs the fuzzers found (fuzz/corpus/*/found-*) are kept.
#   fuzz/seeds/make_corpus.sh        (after scripts/build.sh)
set -eu
cd "$(dirname "$0")/../.."
build=${FSDPP_BUILD_DIR:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
c++ -std=c++17 -O1 -D_GLIBCXX_USE_CXX11_ABI=1 -Iinclude -isystem /usr/include/torch/csrc/api/include \
  fuzz/seeds/save_seed_checkpoints.cpp -o "$tmp/save_seed_checkpoints" \
  -L"$build" -Wl,-rpath,"$(pwd)/$build" -lfsdpp -ltorch -ltorch_cpu -lc10
"$tmp/save_seed_checkpoints" "$tmp/saved"
for d in fuzz/corpus/*/; do if [ -d "$d" ]; then find "$d" -type f ! -name "found-*" -delete; fi; done
python3 fuzz/seeds/make_corpus.py "$tmp/saved" fuzz/corpus
for d in fuzz/corpus/*/; do echo "$d: $(ls "$d" | wc -l) files"; done

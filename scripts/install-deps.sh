#!/bin/sh
# Installs what fsdpp needs, on Debian 12 or 13; skips what is present.
#   FSDPP_LIBTORCH=pypi (default; scripts/libtorch.sh): PyTorch's libtorch from PyPI
#     (torch==2.15.*, CUDA-enabled, with safetensors, and transformers for the Llama parity
#     tests) into a virtual environment outside the
#     repository; Debian's libgloo-dev for the Gloo headers PyTorch's libtorch lacks.
#   FSDPP_LIBTORCH=debian: Debian's libtorch-dev and python3-torch (Debian 13: 2.6), with OpenBLAS
#     in place of the reference libblas.so.3 libtorch would otherwise multiply with (15x slower).
# fortunes: the main job's text (scripts/make-corpus.sh). More Debian packages may be named
# (scripts/run-fuzzers.sh adds clang's).
#   scripts/install-deps.sh [PACKAGE...]
set -eu
cd "$(dirname "$0")/.."
FSDPP_TRANSFORMERS_SPEC=${FSDPP_TRANSFORMERS_SPEC:-transformers>=4.56,<6}
. scripts/libtorch.sh
packages="cmake g++ make ccache libgloo-dev nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev
  libgmock-dev libxxhash-dev libonig-dev libicu-dev libsentencepiece-dev python3 iproute2 fortunes $*"
case "$FSDPP_LIBTORCH" in
  pypi) packages="$packages python3-venv" ;;
  debian) packages="$packages libtorch-dev python3-torch libopenblas0-pthread" ;;
esac
. /etc/os-release
case "${VERSION_ID:-}" in
  12 | 13) ;;
  *) echo "install-deps: Debian 12 or 13 expected, found ${PRETTY_NAME:-unknown}; trying anyway" >&2 ;;
esac
# The interop tests read fsdpp's files with Python's safetensors (from PyPI on the pypi leg).
if [ "$FSDPP_LIBTORCH" = debian ]; then packages="$packages python3-safetensors"; fi
missing=$(for p in $packages; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -q
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
fi
if [ "$FSDPP_LIBTORCH" = pypi ]; then
  # PyPI's torch is CUDA-enabled: its CMake package stops without the CUDA toolkit.
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
    echo "install-deps: PyPI's $FSDPP_TORCH_SPEC is CUDA-enabled, and its CMake package needs the CUDA" \
      "toolkit (nvcc, on PATH or in /usr/local/cuda) at configure time; no GPU is needed." \
      "Install NVIDIA's CUDA toolkit, or build against Debian's libtorch (FSDPP_LIBTORCH=debian, Debian 13)." >&2
    exit 1; }
  # The venv is made with Debian's Python, so the same steps work on Debian 12 and 13; a marker
  # names the spec installed. A folder without the marker is not this script's: left alone.
  marker="$FSDPP_TORCH_VENV/.fsdpp-installed"
  if [ ! -f "$marker" ] || [ "$(cat "$marker")" != "$FSDPP_TORCH_SPEC" ]; then
    if [ -e "$FSDPP_TORCH_VENV" ] && [ ! -f "$marker" ]; then
      echo "install-deps: $FSDPP_TORCH_VENV exists but was not made by this script; move it away or set" \
        "FSDPP_TORCH_VENV to another folder" >&2
      exit 1
    fi
    echo "install-deps: installing $FSDPP_TORCH_SPEC and safetensors from PyPI into $FSDPP_TORCH_VENV"
    rm -rf "$FSDPP_TORCH_VENV"
    /usr/bin/python3 -m venv "$FSDPP_TORCH_VENV"
    "$FSDPP_PYTHON" -m pip install -q "$FSDPP_TORCH_SPEC" safetensors numpy
    echo "$FSDPP_TORCH_SPEC" >"$marker"
  fi
  # transformers: the Llama parity tests' reference (tests/models/llama_reference.py); with it
  # tokenizers, the tokenizer tests' and the main job's tokenizer trainer. sentencepiece: the
  # tokenizer tests' SentencePiece models; tensorboard: reads the trainer's event files in tests.
  "$FSDPP_PYTHON" -c 'import transformers' 2>/dev/null ||
    "$FSDPP_PYTHON" -m pip install -q "$FSDPP_TRANSFORMERS_SPEC"
  "$FSDPP_PYTHON" -c 'import sentencepiece, tensorboard' 2>/dev/null ||
    "$FSDPP_PYTHON" -m pip install -q "sentencepiece>=0.2,<0.3" "tensorboard>=2.16,<3"
fi

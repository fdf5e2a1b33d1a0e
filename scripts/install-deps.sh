#!/bin/sh
# Installs what fsdpp needs from Debian's packages, on Debian 12 (libtorch 1.13) or Debian 13
# (libtorch 2.6); skips the download when all are present. OpenBLAS replaces the reference
# libblas.so.3 that libtorch would otherwise multiply matrices with (15x slower here). On Debian
# 12, clang 14 and its runtime too, for the fuzzers CI runs there. fortunes: the main job's text
# (scripts/make-corpus.sh).
set -eu
packages="cmake g++ make ccache libtorch-dev libgloo-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libxxhash-dev python3-torch libopenblas0-pthread iproute2 fortunes"
. /etc/os-release
case "${VERSION_ID:-}" in
  12) packages="$packages clang-14 libclang-rt-14-dev llvm-14" ;;  # libFuzzer + sanitizers, llvm-symbolizer (scripts/run-fuzzers.sh)
  13) packages="$packages python3-safetensors" ;;  # the interop test reads our files with it
  *) echo "install-deps: Debian 12 or 13 expected, found ${PRETTY_NAME:-unknown}; trying anyway" >&2 ;;
esac
missing=$(for p in $packages; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"; done)
[ -z "$missing" ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -q
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing

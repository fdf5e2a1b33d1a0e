#!/bin/sh
# Configures and builds everything into ./build (RelWithDebInfo, ccache when present).
set -eu
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j2

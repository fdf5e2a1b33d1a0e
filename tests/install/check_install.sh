#!/bin/sh
# cmake --install into a temp prefix; then, with nothing but that prefix and libtorch's own: run the installed
# fsdpp-run and fsdpp-ckpt, and build and run a user's project that find_package()s fsdpp.
# No LD_LIBRARY_PATH anywhere: the installed files must find libfsdpp by themselves.
set -eu
build_dir=$1
torch_prefix=${2:-}  # where libtorch's CMake package is, when not in a system folder (PyPI's torch)
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/fsdpp-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
bin=$work/prefix/bin
"$bin/fsdpp-ckpt" --help >/dev/null
cmake -S "$source_dir/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix${torch_prefix:+;$torch_prefix}" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer" "$work/ckpt1" "$work/store"
"$bin/fsdpp-run" --nproc-per-node 2 --master-port 29631 "$work/build/consumer" "$work/ckpt2"
"$bin/fsdpp-ckpt" verify "$work/ckpt2"
"$bin/fsdpp-ckpt" inspect "$work/ckpt2" | grep -q "rows"
"$bin/fsdpp-ckpt" consolidate "$work/ckpt2" "$work/model.safetensors"
test -s "$work/model.safetensors"
echo "install ok: $(cd "$work/prefix" && find . -type f | wc -l) files installed, tools and a user's project ran"

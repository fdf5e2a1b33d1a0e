#!/bin/sh
# On the accelerator machine (docs/building.md, "GPU tests"): builds fsdpp against that machine's
# own PyTorch (its libtorch is CUDA-enabled, with NCCL) and runs the GPU tests, within 8 minutes.
# Run it from the repository root with the build dependencies the machine lacks carried in
# .device-deps/ (../shared/tools/device-deps.sh makes it), for example through the device tool:
#   run(command="sh scripts/run-gpu-tests.sh", carry=[".device-deps"], timeout_s=540)
# Prints the GPU, the libtorch and each step's time; writes the full logs to $OUT when set.
#   scripts/run-gpu-tests.sh [REPEATS]   # the GPU tests' runs (default 3: stream bugs show
#                                        # as wrong numbers only sometimes)
set -eu
repeats=${1:-3}
log=${OUT:-/tmp}/gpu-tests.log
: >"$log"
step() { echo "== $(date +%T) $*" | tee -a "$log"; }
[ -d .device-deps ] || { echo "run-gpu-tests: .device-deps/ missing (../shared/tools/device-deps.sh, then carry it)" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"
python=$(command -v python3)
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
"$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' | tee -a "$log"

step "configure"
cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDPP_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.device-deps" -DCMAKE_CXX_FLAGS="-I$PWD/.device-deps/include" \
  >>"$log" 2>&1 || { tail -30 "$log"; exit 1; }
step "build (library and tests)"
ninja -C build-device -j16 fsdpp_tests >>"$log" 2>&1 || { grep -E "error|FAILED" "$log" | head -40; exit 1; }

# The device paths, then the CPU suites they touch (a device change must not break those).
gpu_filter='Cuda*:DeviceBackends.*'
cpu_filter='ProcessGroup*:Collectives*:CommDebugMode*'
status=0
out=$(mktemp)
run_tests() {  # FILTER: the tests' last lines here, all of them in the log; a failure fails the script
  if OPENBLAS_NUM_THREADS=1 build-device/tests/fsdpp_tests --gtest_filter="$1" --gtest_brief=1 >"$out" 2>&1; then :; else status=1; fi
  cat "$out" >>"$log"
  tail -25 "$out"
}
i=1
while [ "$i" -le "$repeats" ]; do
  step "GPU tests, run $i of $repeats"
  run_tests "$gpu_filter"
  i=$((i + 1))
done
step "CPU suites beside them"
run_tests "$cpu_filter"
step "done (status $status)"
exit $status

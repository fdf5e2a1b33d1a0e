#!/bin/sh
# On the accelerator machine (docs/building.md, "GPU tests"): builds fsdpp against that machine's
# own PyTorch (its libtorch is CUDA-enabled, with NCCL) and runs the GPU tests, within 8 minutes.
# Then the GPU benchmark: fsdpp's FSDP step (bench/bench_fsdp_device.cpp) against PyTorch's FSDP2
# (bench/bench_fsdp.py --device cuda) at world size 1 in bfloat16, on bench_fsdp's transformer and
# a 12-layer dim-1024 one: step time, peak memory, tokens/s and MFU of each, and the ratios. Last,
# the trainer (examples/train_gpt) on the GPU in bfloat16 at that 12-layer shape: tokens/s and MFU.
# Run it from the repository root with the build dependencies the machine lacks carried in
# .device-deps/ (../shared/tools/device-deps.sh makes it), for example through the device tool:
#   run(command="sh scripts/run-gpu-tests.sh", carry=[".device-deps"], timeout_s=540)
# Prints the GPU, the libtorch and each step's time; writes the full logs to $OUT when set.
#   scripts/run-gpu-tests.sh [REPEATS]   # the GPU tests' runs (default 2: stream bugs show
#                                        # as wrong numbers only sometimes)
set -eu
repeats=${1:-2}
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
step "build (library, tests, the GPU benchmark, fsdpp-run)"
ninja -C build-device -j16 fsdpp_tests bench_fsdp_device fsdpp-run train_gpt >>"$log" 2>&1 ||
  { grep -E "error|FAILED" "$log" | head -40; exit 1; }

# The device paths, then the CPU suites they touch (a device change must not break those).
gpu_filter='Cuda*:DeviceBackends.*'
cpu_filter='ProcessGroup*:Collectives*:CommDebugMode*:FakeProcessGroup*'
status=0
out=$(mktemp)
run_tests() {  # FILTER [VAR=VALUE]: the tests' last lines here, all of them in the log; a failure fails the script
  if env OPENBLAS_NUM_THREADS=1 ${2:-} build-device/tests/fsdpp_tests --gtest_filter="$1" >"$out" 2>&1; then :; else status=1; fi
  cat "$out" >>"$log"
  grep -E "^\[  (FAILED|SKIPPED) +\] [A-Z]|tests? from .* ran|^\[  PASSED" "$out" | tail -40
  # A GPU test that skips here did not see the GPU (a process that touched CUDA before forking
  # its ranks makes them see none): that is a failure on this machine.
  if grep -q "^\[  SKIPPED \] Cuda" "$out"; then
    echo "run-gpu-tests: GPU tests skipped on a GPU machine (their ranks saw no CUDA device)"
    status=1
  fi
}
i=1
while [ "$i" -le "$repeats" ]; do
  step "GPU tests, run $i of $repeats"
  run_tests "$gpu_filter"
  i=$((i + 1))
done
# The same with the host waiting for each device collective (so not the overlap test): a test
# that fails above and passes here points at the streams' ordering, not at the numerics.
step "GPU tests, TORCH_NCCL_BLOCKING_WAIT=1"
run_tests "$gpu_filter:-CudaOverlap*" TORCH_NCCL_BLOCKING_WAIT=1
step "CPU suites beside them"
run_tests "$cpu_filter"

# One line per library and shape, then fsdpp / PyTorch for step time and peak memory.
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
for shape in "" "--layers 12 --dim 1024 --heads 16 --vocab 32000 --seq 512 --local-batch 8"; do
  step "GPU benchmark, bf16, world size 1: ${shape:-bench_fsdp's transformer}"
  # shellcheck disable=SC2086
  ours=$(build-device/tools/fsdpp-run --nproc-per-node 1 build-device/bench/bench_fsdp_device $shape 2>>"$log" | tail -1)
  # shellcheck disable=SC2086
  theirs=$("$python" -m torch.distributed.run --nproc_per_node 1 --master_port 29671 bench/bench_fsdp.py --mode fsdp2 \
    --device cuda --param-dtype bf16 $shape 2>>"$log" | tail -1)
  echo "$ours" | tee -a "$log"
  echo "$theirs" | tee -a "$log"
  if ratios=$(awk -v a="$(echo "$ours" | field median_step_ms)" -v b="$(echo "$theirs" | field median_step_ms)" \
      -v c="$(echo "$ours" | field peak_step_MiB)" -v d="$(echo "$theirs" | field peak_step_MiB)" \
      'BEGIN { if (a > 0 && b > 0 && c > 0 && d > 0) printf "fsdpp / FSDP2: step time %.3fx, peak memory %.3fx\n", a / b, c / d;
               else { print "GPU benchmark: a run printed no result (see the log)"; exit 1 } }'); then :; else status=1; fi
  echo "$ratios" | tee -a "$log"
done
step "trainer on the GPU (--device cuda, deferred init): bf16, 12 layers, dim 1024, seq 512, batch 8"
cat docs/*.md >build-device/corpus.txt  # ~0.5 MB of text: enough bytes for 40 steps
if build-device/tools/fsdpp-run --nproc-per-node 1 build-device/examples/train_gpt --data build-device/corpus.txt \
    --device cuda --param-dtype bfloat16 --layers 12 --dim 1024 --heads 16 --seq 512 --batch 8 --steps 40 \
    --warmup 5 --log-every 10 --eval-every 40 --eval-batches 2 --progress-bar false >"$out" 2>&1; then :; else status=1; fi
cat "$out" >>"$log"
grep -E "^train_gpt|^step|^done|rank [0-9]+:" "$out" | tail -12
step "done (status $status)"
exit $status

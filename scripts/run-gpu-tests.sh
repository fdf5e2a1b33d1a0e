#!/bin/sh
# On the accelerator machine (docs/building.md, "GPU tests"): fsdpp's GPU check as two calls of at
# most 5 minutes each, so that both and a rerun fit one 15-minute device session:
#   run(command="sh scripts/run-gpu-tests.sh tests", carry=[".device-deps"], timeout_s=300)
#   run(command="sh scripts/run-gpu-tests.sh bench", carry=[".device-deps"], timeout_s=300)
# (../shared/tools/device-deps.sh makes .device-deps/: the build dependencies the machine lacks;
# then scripts/device-deps-tokenizers.sh adds the tokenizers' Oniguruma, ICU and SentencePiece.)
#   tests: builds only the GPU test sources (with the harness and the library) against the
#          machine's own PyTorch and runs them once through ctest, four groups at a time on the
#          GPU; a failing group is rerun once with TORCH_NCCL_BLOCKING_WAIT=1 (passing there points
#          at the streams' ordering, failing again at the numerics).
#   bench: fsdpp's FSDP step (bench/bench_fsdp_device.cpp) against PyTorch's FSDP2
#          (bench/bench_fsdp.py --device cuda) at world size 1 in bfloat16 on bench_fsdp's
#          transformer and a 12-layer dim-1024 one, with the ratios; then the trainer
#          (examples/train_gpt) on the GPU at that 12-layer shape: tokens/s and MFU.
# Both print the GPU, driver, nvcc, torch, CUDA and NCCL versions first. Everything is appended to
# $OUT/gpu-<phase>.log as it runs (a call killed at its limit keeps what it printed), a failing
# rank's whole log goes to $OUT/failed-ranks/, and a rank that dies of a signal prints its
# backtrace into that log (tests/harness).
set -eu
phase=${1:-}
case "$phase" in tests | bench) ;; *) echo "usage: scripts/run-gpu-tests.sh tests|bench" >&2; exit 2 ;; esac
out=${OUT:-/tmp/fsdpp-gpu}
mkdir -p "$out"
log=$out/gpu-$phase.log
: >"$log"
start=$(date +%s)
say() { echo "$*" | tee -a "$log"; }
step() { say "== +$(($(date +%s) - start))s $*"; }
# Runs a command with its output streamed to the terminal and the log; returns its status.
logged() {
  rc_file=$(mktemp)
  { "$@" 2>&1 || echo $? >"$rc_file"; } | tee -a "$log"
  rc=$(cat "$rc_file" 2>/dev/null)
  rm -f "$rc_file"
  return "${rc:-0}"
}
[ -d .device-deps ] || { echo "run-gpu-tests: .device-deps/ missing (../shared/tools/device-deps.sh, then carry it)" >&2; exit 2; }
[ -f .device-deps/include/oniguruma.h ] || {
  echo "run-gpu-tests: .device-deps/ lacks the tokenizers' libraries (scripts/device-deps-tokenizers.sh)" >&2; exit 2; }

step "versions"
logged nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
logged sh -c 'nvcc --version | tail -2' || true
python=$(command -v python3)
logged "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())))'
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')

build="build-device"
step "configure"
sources=""
[ "$phase" = tests ] && sources="/gpu/"  # only the GPU tests (and the harness) in fsdpp_tests
logged cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDPP_PYTHON="$python" \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.device-deps" -DCMAKE_CXX_FLAGS="-I$PWD/.device-deps/include" \
  -DFSDPP_TEST_SOURCES_MATCHING="$sources" >/dev/null
status=0
if [ "$phase" = tests ]; then
  step "build (library, GPU tests)"
  logged ninja -C "$build" -j16 fsdpp_tests | grep -E "error|FAILED|warning" || true
  [ -x "$build/tests/fsdpp_tests" ] || { say "run-gpu-tests: the build failed (see $log)"; exit 1; }
  export FSDPP_TEST_FAILED_LOGS="$out/failed-ranks" OPENBLAS_NUM_THREADS=1
  step "GPU tests (ctest, 4 groups at a time)"
  # A GPU test that skips here did not see the GPU: on this machine that fails the run.
  if ! logged ctest --test-dir "$build" -R '^Cuda' -j4 --output-on-failure --timeout 240; then status=1; fi
  if grep -q "Skipped" "$log"; then say "run-gpu-tests: GPU tests skipped on a GPU machine (their ranks saw no CUDA device)"; status=1; fi
  if [ "$status" -ne 0 ]; then
    step "the failed groups again, TORCH_NCCL_BLOCKING_WAIT=1"
    logged env TORCH_NCCL_BLOCKING_WAIT=1 ctest --test-dir "$build" --rerun-failed -j4 --output-on-failure --timeout 240 || true
  fi
else
  step "build (library, GPU benchmark, fsdpp-run, trainer)"
  logged ninja -C "$build" -j16 bench_fsdp_device fsdpp-run train_gpt | grep -E "error|FAILED|warning" || true
  field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p"; }
  for shape in "" "--layers 12 --dim 1024 --heads 16 --vocab 32000 --seq 512 --local-batch 8"; do
    step "GPU benchmark, bf16, world size 1: ${shape:-the transformer of bench_fsdp}"
    # shellcheck disable=SC2086
    ours=$("$build"/tools/fsdpp-run --nproc-per-node 1 "$build"/bench/bench_fsdp_device $shape 2>>"$log" | tail -1)
    # shellcheck disable=SC2086
    theirs=$("$python" -m torch.distributed.run --nproc_per_node 1 --master_port 29671 bench/bench_fsdp.py --mode fsdp2 \
      --device cuda --param-dtype bf16 $shape 2>>"$log" | tail -1)
    say "$ours"
    say "$theirs"
    if ratios=$(awk -v a="$(echo "$ours" | field median_step_ms)" -v b="$(echo "$theirs" | field median_step_ms)" \
        -v c="$(echo "$ours" | field peak_step_MiB)" -v d="$(echo "$theirs" | field peak_step_MiB)" \
        'BEGIN { if (a > 0 && b > 0 && c > 0 && d > 0) printf "fsdpp / FSDP2: step time %.3fx, peak memory %.3fx\n", a / b, c / d;
                 else { print "GPU benchmark: a run printed no result (see the log)"; exit 1 } }'); then :; else status=1; fi
    say "$ratios"
  done
  step "trainer on the GPU (--device cuda, deferred init): bf16, 12 layers, dim 1024, seq 512, batch 8"
  cat docs/*.md >"$build"/corpus.txt  # ~0.5 MB of text: enough bytes for 40 steps
  if ! logged "$build"/tools/fsdpp-run --nproc-per-node 1 "$build"/examples/train_gpt --data "$build"/corpus.txt \
      --device cuda --param-dtype bfloat16 --layers 12 --dim 1024 --heads 16 --seq 512 --batch 8 --steps 40 \
      --warmup 5 --log-every 10 --eval-every 40 --eval-batches 2 --progress-bar false; then status=1; fi
fi
step "done (status $status)"
exit $status

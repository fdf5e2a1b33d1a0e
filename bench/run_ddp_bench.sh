#!/bin/sh
# Step time of one process vs fsdpp DDP vs PyTorch's Python DDP (same MLP, batch, Gloo), in
# one run, at N = 2 and 4. Usage: bench/run_ddp_bench.sh [build-dir]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
torchrun="/usr/bin/python3 $here/../tests/torchrun/torchrun.py"
args="--hidden 1024 --layers 4 --global-batch 64 --steps 30"
step_ms() { sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p' | tail -n 1; }
single=$("$build/bench/bench_ddp" --mode single $args | step_ms)
echo "single process, global batch: $single ms/step"
for n in 2 4; do
  ours=$("$build/tools/fsdpp-run" --nproc-per-node $n --master-port 29631 "$build/bench/bench_ddp" --mode ddp $args | step_ms)
  theirs=$($torchrun --nproc_per_node $n --master_port 29632 "$here/bench_ddp.py" $args 2>/dev/null | step_ms)
  awk -v n=$n -v a="$ours" -v b="$theirs" -v s="$single" 'BEGIN {
    printf "N=%d: fsdpp DDP %s ms/step, Python DDP %s ms/step, fsdpp/Python = %.2f, fsdpp/single = %.2f\n", n, a, b, a / b, a / s }'
done

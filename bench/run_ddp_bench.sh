#!/bin/sh
# Step time of one process vs fsdpp DDP vs PyTorch's Python DDP (same MLP, batch, Gloo), at
# N = 2 and 4. The two DDPs run alternately, ROUNDS times (default 3), so machine noise hits
# both alike; each round prints its ratio, then the median ratio per N.
# Usage: [ROUNDS=5] bench/run_ddp_bench.sh [build-dir]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/libtorch.sh"  # FSDPP_PYTHON: the Python whose torch fsdpp links
build=${1:-$here/../${FSDPP_BUILD_DIR:-build}}
rounds=${ROUNDS:-3}
torchrun="$FSDPP_PYTHON $here/../tests/torchrun/torchrun.py"
args="--hidden 1024 --layers 4 --global-batch 64 --steps 30"
step_ms() { sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p' | tail -n 1; }
single=$("$build/bench/bench_ddp" --mode single $args | step_ms)
echo "single process, global batch: $single ms/step"
for n in 2 4; do
  ratios=""
  round=1
  while [ "$round" -le "$rounds" ]; do
    ours=$("$build/tools/fsdpp-run" --nproc-per-node $n --master-port 29631 "$build/bench/bench_ddp" --mode ddp $args | step_ms)
    theirs=$($torchrun --nproc_per_node $n --master_port 29632 "$here/bench_ddp.py" $args 2>/dev/null | step_ms)
    ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.3f", a / b }')
    awk -v n=$n -v r=$round -v a="$ours" -v b="$theirs" -v s="$single" 'BEGIN {
      printf "N=%d round %d: fsdpp DDP %s ms/step, Python DDP %s ms/step, fsdpp/Python = %.3f, fsdpp/single = %.2f\n", n, r, a, b, a / b, a / s }'
    ratios="$ratios $ratio"
    round=$((round + 1))
  done
  echo "$ratios" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk -v n=$n '{ r[NR] = $1 } END {
    printf "N=%d: median fsdpp/Python over %d rounds = %.3f (min %.3f, max %.3f)\n", n, NR, r[int((NR + 1) / 2)], r[1], r[NR] }'
done

#!/bin/sh
# fsdpp (built against libtorch 2.6) vs PyTorch 2.6's own FSDP1 and DDP in Python, on
# bench_fsdp's transformer: same model, local batch, Adam, one thread per rank, Gloo on CPU.
# N = 2 and 4, ROUNDS alternating rounds (default 3) so machine noise hits both alike; each
# round prints its step times and ratios, then the median ratio per N. Run in Debian 13:
#   scripts/in-debian13.sh bench/run_anchor_bench.sh        [ROUNDS=5] [STEPS=10]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../${FSDPP_BUILD_DIR:-build-debian13}}
rounds=${ROUNDS:-3}
steps=${STEPS:-10}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 USE_LIBUV=0
torchrun="python3 $here/../tests/torchrun/torchrun.py"
args="--layers 4 --dim 256 --vocab 1024 --local-batch 2 --steps $steps"
echo "# $("$here/../scripts/describe-platform.sh"); PyTorch $(python3 -c 'import torch; print(torch.__version__)')"
ms_of() { sed -n "s/.*$1 \([0-9.]*\) ms.*/\1/p" | head -n 1; }
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ r[NR] = $1 } END { printf "%.3f (min %.3f, max %.3f, %d rounds)", r[int((NR + 1) / 2)], r[1], r[NR], NR }'; }
for n in 2 4; do
  fsdp_ratios="" ddp_ratios=""
  round=1
  while [ "$round" -le "$rounds" ]; do
    ours=$("$build/tools/fsdpp-run" --nproc-per-node $n --master-port 29641 "$build/bench/bench_fsdp" $args)
    our_fsdp=$(echo "$ours" | ms_of "step time (median): FSDP")
    our_ddp=$(echo "$ours" | ms_of "without prefetch [0-9.]* ms, DDP")
    py_fsdp=$($torchrun --nproc_per_node $n --master_port 29642 "$here/bench_fsdp.py" --mode fsdp $args 2>/dev/null |
      sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p')
    py_ddp=$($torchrun --nproc_per_node $n --master_port 29643 "$here/bench_fsdp.py" --mode ddp $args 2>/dev/null |
      sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p')
    r_fsdp=$(awk -v a="$our_fsdp" -v b="$py_fsdp" 'BEGIN { printf "%.3f", a / b }')
    r_ddp=$(awk -v a="$our_ddp" -v b="$py_ddp" 'BEGIN { printf "%.3f", a / b }')
    echo "N=$n round $round: FSDP fsdpp $our_fsdp ms, PyTorch FSDP1 $py_fsdp ms, ratio $r_fsdp;" \
      "DDP fsdpp $our_ddp ms, PyTorch $py_ddp ms, ratio $r_ddp"
    fsdp_ratios="$fsdp_ratios $r_fsdp"
    ddp_ratios="$ddp_ratios $r_ddp"
    round=$((round + 1))
  done
  echo "N=$n: median fsdpp/PyTorch FSDP = $(echo "$fsdp_ratios" | median); DDP = $(echo "$ddp_ratios" | median)"
done
# PyTorch 2.6's FSDP2 on CPU, for the record (it is not expected to run).
fsdp2=$($torchrun --nproc_per_node 2 --master_port 29644 "$here/bench_fsdp.py" --mode fsdp2 --steps 1 2>&1 |
  grep -E "Error|error" | grep -v "^ *File" | head -n 1 || true)
echo "PyTorch FSDP2 fully_shard on CPU: ${fsdp2:-ran}"

#!/bin/sh
# fsdpp (built against libtorch 2.6) vs PyTorch 2.6's own FSDP1 and DDP in Python, on
# bench_fsdp's transformer: same model, local batch, Adam, warm-up and timing, one thread per
# rank, Gloo on CPU. For N = 2 and 4, ROUNDS alternating rounds (default 3) so machine noise
# hits both sides alike; each round prints the step times and fsdpp/PyTorch ratios, then the
# median ratio per N. Last, what PyTorch 2.6's FSDP2 fully_shard does on CPU.
# Run in Debian 13 (python3-torch 2.6), after building build-debian13 there:
#   scripts/in-debian13.sh bench/run_anchor_bench.sh [build-dir]
#   scripts/in-debian13.sh env ROUNDS=5 STEPS=10 bench/run_anchor_bench.sh   (in-debian13 clears the env)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../${FSDPP_BUILD_DIR:-build-debian13}}
rounds=${ROUNDS:-3}
steps=${STEPS:-10}
for f in "$build/bench/bench_fsdp" "$build/tools/fsdpp-run"; do
  [ -x "$f" ] || { echo "run_anchor_bench: no $f (build bench_fsdp and fsdpp-run there first)" >&2; exit 1; }
done
torch_version=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null) || torch_version=none
case "$torch_version" in
  2.*) ;;
  *) echo "run_anchor_bench: needs python3-torch 2.x (found: $torch_version); run it via scripts/in-debian13.sh" >&2
     exit 1 ;;
esac
# Every rank one thread; Debian's TCPStore has no libuv; no bench/__pycache__ left behind.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 USE_LIBUV=0 PYTHONDONTWRITEBYTECODE=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
torchrun="python3 $here/../tests/torchrun/torchrun.py"
args="--layers 4 --dim 256 --vocab 1024 --local-batch 2 --steps $steps"  # bench_fsdp's defaults
echo "# $("$here/../scripts/describe-platform.sh"); python3-torch $torch_version; steps=$steps"

# run NAME CMD...: CMD's stdout; on failure, the tail of its output and stop.
run() {
  name=$1; shift
  "$@" >"$logs/$name" 2>&1 || { echo "run_anchor_bench: $name failed:" >&2; tail -n 20 "$logs/$name" >&2; exit 1; }
  cat "$logs/$name"
}
# bench_fsdp prints "step time (median): FSDP a ms, FSDP without prefetch b ms, DDP c ms, ..."
ms_after() { sed -n "s/.*$1 \([0-9.]*\) ms.*/\1/p" | head -n 1; }
py_ms() { sed -n 's/.*median_step_ms=\([0-9.]*\).*/\1/p' | head -n 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "") { print "?"; exit 1 } printf "%.3f", a / b }'; }
median() {
  tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ r[NR] = $1 } END {
    printf "%.3f (min %.3f, max %.3f, %d rounds)", r[int((NR + 1) / 2)], r[1], r[NR], NR }'
}

for n in 2 4; do
  fsdp_ratios="" ddp_ratios=""
  round=1
  while [ "$round" -le "$rounds" ]; do
    # One bench_fsdp run times fsdpp's FSDP and then its DDP (and more) in the same process.
    ours=$(run "fsdpp-N$n" "$build/tools/fsdpp-run" --nproc-per-node $n --master-port 29641 "$build/bench/bench_fsdp" $args)
    our_fsdp=$(echo "$ours" | ms_after "step time (median): FSDP")
    our_ddp=$(echo "$ours" | ms_after "without prefetch [0-9.]* ms, DDP")
    py_fsdp=$(run "pytorch-fsdp-N$n" $torchrun --nproc_per_node $n --master_port 29642 "$here/bench_fsdp.py" --mode fsdp $args | py_ms)
    py_ddp=$(run "pytorch-ddp-N$n" $torchrun --nproc_per_node $n --master_port 29643 "$here/bench_fsdp.py" --mode ddp $args | py_ms)
    r_fsdp=$(ratio "$our_fsdp" "$py_fsdp") && r_ddp=$(ratio "$our_ddp" "$py_ddp") || {
      echo "run_anchor_bench: a step time is missing (fsdpp: '$ours')" >&2; exit 1; }
    echo "N=$n round $round: FSDP fsdpp $our_fsdp ms, PyTorch FSDP1 $py_fsdp ms, fsdpp/PyTorch $r_fsdp;" \
      "DDP fsdpp $our_ddp ms, PyTorch $py_ddp ms, fsdpp/PyTorch $r_ddp"
    fsdp_ratios="$fsdp_ratios $r_fsdp"
    ddp_ratios="$ddp_ratios $r_ddp"
    round=$((round + 1))
  done
  echo "N=$n: median fsdpp/PyTorch FSDP = $(echo "$fsdp_ratios" | median); DDP = $(echo "$ddp_ratios" | median)"
done

# PyTorch 2.6's FSDP2 on CPU, for the record: expected to fail; its failure does not stop us.
fsdp2=$($torchrun --nproc_per_node 2 --master_port 29644 "$here/bench_fsdp.py" --mode fsdp2 --steps 1 \
  2>"$logs/fsdp2.err" | grep -E "fsdp2|median_step_ms" | head -n 1) || true
[ -n "$fsdp2" ] || fsdp2="no result; last error line: $(grep -E "Error" "$logs/fsdp2.err" | tail -n 1)"
echo "PyTorch FSDP2 fully_shard on CPU: $fsdp2"

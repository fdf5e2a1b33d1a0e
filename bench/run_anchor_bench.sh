#!/bin/sh
# fsdpp vs PyTorch's own FSDP2 (fully_shard), FSDP1 (FullyShardedDataParallel) and DDP in Python,
# all from the torch that fsdpp was built against (scripts/libtorch.sh), on bench_fsdp's
# transformer: same model, local batch, Adam, warm-up and timing, one thread per rank, Gloo on
# CPU. For N = 2 and 4, ROUNDS alternating rounds (default 3) so machine noise hits every side
# alike; each round prints the step times and fsdpp/PyTorch ratios, then per N the median ratios,
# and last a summary against the targets: fsdpp FSDP <= 0.5x FSDP2, <= 0.8x FSDP1; fsdpp DDP
# <= 0.95x PyTorch DDP. Where FSDP2 cannot run on CPU (2.6) it is reported unavailable.
# PyPI's torch 2.15 (the default leg), after scripts/build.sh built build/:
#   bench/run_anchor_bench.sh [build-dir]
#   ROUNDS=5 STEPS=10 bench/run_anchor_bench.sh
# Debian 13's torch 2.6, after building build-debian13 there (in-debian13 clears the env):
#   scripts/in-debian13.sh bench/run_anchor_bench.sh
#   scripts/in-debian13.sh env ROUNDS=5 STEPS=10 bench/run_anchor_bench.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../scripts/libtorch.sh"  # FSDPP_PYTHON: the Python whose torch fsdpp links
build=${1:-$here/../${FSDPP_BUILD_DIR:-build}}
rounds=${ROUNDS:-3}
steps=${STEPS:-10}
for f in "$build/bench/bench_fsdp" "$build/tools/fsdpp-run"; do
  [ -x "$f" ] || { echo "run_anchor_bench: no $f (build bench_fsdp and fsdpp-run there first)" >&2; exit 1; }
done
torch_version=$("$FSDPP_PYTHON" -c 'import torch; print(torch.__version__)' 2>/dev/null) || torch_version=none
case "$torch_version" in
  2.*) ;;
  *) echo "run_anchor_bench: needs torch 2.x in $FSDPP_PYTHON (found: $torch_version); see scripts/install-deps.sh" >&2
     exit 1 ;;
esac
cores=$(nproc)  # before OMP_NUM_THREADS=1, which nproc reports instead
# Every rank one thread (PyPI's torch multiplies with MKL on OpenMP, Debian's with OpenBLAS);
# the agent's store without libuv (Debian's TCPStore lacks it; harmless on PyPI's); no
# bench/__pycache__ left behind.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 USE_LIBUV=0 PYTHONDONTWRITEBYTECODE=1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
torchrun="$FSDPP_PYTHON $here/../tests/torchrun/torchrun.py"
args="--layers 4 --dim 256 --vocab 1024 --local-batch 2 --steps $steps"  # bench_fsdp's defaults
echo "# $("$here/../scripts/describe-platform.sh"); steps=$steps, rounds=$rounds"
[ "$cores" -ge 4 ] || echo "# note: $cores cores: the N = 4 ranks share them (the targets are set for these 2-core machines)"

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
# verdict NAME RATIOS TARGET: "NAME m (target <= TARGET: met)", m the median of RATIOS.
verdict() {
  m=$(echo "$2" | median | cut -d ' ' -f 1)
  awk -v m="$m" -v t="$3" -v name="$1" 'BEGIN { printf "%s %s (target <= %s: %s)", name, m, t, (m <= t) ? "met" : "NOT met" }'
}

fsdp2_error=""  # set at FSDP2's first failure (2.6 on CPU); later rounds leave it out
summary=""
for n in 2 4; do
  fsdp2_ratios="" fsdp_ratios="" ddp_ratios=""
  round=1
  while [ "$round" -le "$rounds" ]; do
    # One bench_fsdp run times fsdpp's FSDP and then its DDP (and more) in the same process.
    ours=$(run "fsdpp-N$n" "$build/tools/fsdpp-run" --nproc-per-node $n --master-port 29641 "$build/bench/bench_fsdp" $args)
    our_fsdp=$(echo "$ours" | ms_after "step time (median): FSDP")
    our_ddp=$(echo "$ours" | ms_after "without prefetch [0-9.]* ms, DDP")
    [ -n "$our_fsdp" ] && [ -n "$our_ddp" ] || {
      echo "run_anchor_bench: no step times in fsdpp's output: '$ours'" >&2; exit 1; }
    fsdp2="FSDP2 unavailable"
    if [ -z "$fsdp2_error" ]; then
      # Not through run(): FSDP2 failing must not stop the FSDP1 and DDP comparison.
      log=$logs/pytorch-fsdp2-N$n
      $torchrun --nproc_per_node $n --master_port 29644 "$here/bench_fsdp.py" --mode fsdp2 $args >"$log" 2>&1 || true
      py_fsdp2=$(py_ms <"$log")
      if [ -n "$py_fsdp2" ]; then
        r_fsdp2=$(ratio "$our_fsdp" "$py_fsdp2")
        fsdp2="FSDP2 $py_fsdp2 ms, fsdpp/FSDP2 $r_fsdp2"
        fsdp2_ratios="$fsdp2_ratios $r_fsdp2"
      else
        # bench_fsdp.py's one-line report of the failure, else the last error line, else the last line.
        fsdp2_error=$(grep "fully_shard failed" "$log" || grep "Error" "$log" || tail -n 1 "$log" || true)
        fsdp2_error=$(echo "${fsdp2_error:-no output}" | tail -n 1)
        echo "PyTorch FSDP2 fully_shard on CPU unavailable (N=$n): $fsdp2_error"
      fi
    fi
    py_fsdp=$(run "pytorch-fsdp-N$n" $torchrun --nproc_per_node $n --master_port 29642 "$here/bench_fsdp.py" --mode fsdp $args | py_ms)
    py_ddp=$(run "pytorch-ddp-N$n" $torchrun --nproc_per_node $n --master_port 29643 "$here/bench_fsdp.py" --mode ddp $args | py_ms)
    r_fsdp=$(ratio "$our_fsdp" "$py_fsdp") && r_ddp=$(ratio "$our_ddp" "$py_ddp") || {
      echo "run_anchor_bench: a PyTorch step time is missing" >&2; exit 1; }
    echo "N=$n round $round: FSDP fsdpp $our_fsdp ms, $fsdp2, FSDP1 $py_fsdp ms, fsdpp/FSDP1 $r_fsdp;" \
      "DDP fsdpp $our_ddp ms, PyTorch $py_ddp ms, fsdpp/PyTorch $r_ddp"
    fsdp_ratios="$fsdp_ratios $r_fsdp"
    ddp_ratios="$ddp_ratios $r_ddp"
    round=$((round + 1))
  done
  if [ -n "$fsdp2_ratios" ]; then
    echo "N=$n: median fsdpp/FSDP2 = $(echo "$fsdp2_ratios" | median)"
    line="$(verdict fsdpp/FSDP2 "$fsdp2_ratios" 0.5)"
  else
    line="fsdpp/FSDP2 unavailable"
  fi
  echo "N=$n: median fsdpp/FSDP1 = $(echo "$fsdp_ratios" | median); DDP fsdpp/PyTorch = $(echo "$ddp_ratios" | median)"
  summary="${summary}N=$n: $line, $(verdict fsdpp/FSDP1 "$fsdp_ratios" 0.8), $(verdict "DDP fsdpp/PyTorch" "$ddp_ratios" 0.95)
"
done

echo
echo "# Summary (median over rounds of fsdpp's step time / PyTorch's; $torch_version, CPU/Gloo, one thread per rank)"
printf '%s' "$summary"
[ -z "$fsdp2_error" ] || echo "FSDP2 unavailable: $fsdp2_error"

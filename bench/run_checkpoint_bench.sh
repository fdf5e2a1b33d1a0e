#!/bin/sh
# Distributed checkpoint benchmark (issue 6) in one go: the disk's sequential speed by dd, then
# bench_checkpoint at N = 1, 2, 4 (sync save, load cold and warm, a load resharded from the
# previous N's checkpoint: 1 -> 2 and 2 -> 4, the training stall of sync vs async save), then
# dd again to show how much the disk drifted during the run. Temp dirs under /tmp are removed.
# Usage: bench/run_checkpoint_bench.sh [build-dir]   (1.5 min on a quiet 2-core machine, 2.5 with other jobs)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
work=$(mktemp -d /tmp/fsdpp-ckpt-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM
mib=248  # the checkpoint's size (248.3 MiB of float32 at the default model size)

drop=""
if [ "$(id -u)" = 0 ] && [ -w /proc/sys/vm/drop_caches ]; then
  drop="--drop-caches"
  drop_cache() { sync; echo 3 > /proc/sys/vm/drop_caches; }
else
  echo "not root: the page cache is not dropped, cold loads may be served from memory"
  drop_cache() { sync; }
fi

now() { date +%s.%N; }
# dd's own "copied, T s, R MB/s" line, shortened.
dd_rate() { dd "$@" 2>&1 | sed -n 's/.*copied, \(.*\)/\1/p'; }
direct=oflag=direct
if ! dd if=/dev/zero of="$work/probe" bs=1M count=1 oflag=direct 2>/dev/null; then
  echo "O_DIRECT unsupported here: dd writes through the page cache and fsyncs"
  direct=""
fi
rm -f "$work/probe"

disk() {
  echo "dd write $mib MiB, $direct conv=fsync: $(dd_rate if=/dev/zero of="$work/ddtest" bs=1M count=$mib $direct conv=fsync)"
  rm -f "$work/ddtest"
}
echo "== disk, before (df: $(df -h "$work" | awk 'NR == 2 { print $1 ", " $4 " free" }'); load average: $(cut -d' ' -f1-3 /proc/loadavg))"
disk
echo "dd write $mib MiB, buffered + conv=fsync: $(dd_rate if=/dev/zero of="$work/ddtest" bs=1M count=$mib conv=fsync)"
drop_cache
echo "dd read $mib MiB, page cache dropped: $(dd_rate if="$work/ddtest" of=/dev/null bs=1M)"
rm -f "$work/ddtest"
for n in 2 4; do  # n writers of mib/n each at once, as the ranks of a save
  t0=$(now)
  i=0
  while [ $i -lt $n ]; do
    dd if=/dev/zero of="$work/ddtest$i" bs=1M count=$((mib / n)) conv=fsync 2>/dev/null &
    i=$((i + 1))
  done
  wait
  t1=$(now)
  awk -v n=$n -v m=$mib -v a="$t0" -v b="$t1" 'BEGIN {
    printf "dd write %d x %d MiB at once, buffered + conv=fsync: %.3f s, aggregate %.0f MiB/s, %.0f MiB/s per writer\n",
      n, m / n, b - a, m / (b - a), m / n / (b - a) }'
  rm -f "$work"/ddtest*
done

prev=""
port=29681
for n in 1 2 4; do
  echo "== N=$n"
  reshard=""
  [ -n "$prev" ] && reshard="--reshard-from $prev"
  # shellcheck disable=SC2086
  "$build/tools/fsdpp-run" --nproc-per-node $n --master-port $port \
    "$build/bench/bench_checkpoint" --dir "$work/run$n" --keep "$work/keep$n" $drop $reshard
  rm -rf "$work/run$n"
  [ -n "$prev" ] && rm -rf "$prev"
  prev="$work/keep$n"
  port=$((port + 1))
done

echo "== disk, after (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
disk

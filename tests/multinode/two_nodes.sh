#!/bin/sh
# Two "nodes" on one machine: two network namespaces joined by a veth pair (10.231.7.1 and
# 10.231.7.2; nothing else is reachable from them), each running fsdpp-run with 2 ranks.
#   two_nodes.sh FSDPP_RUN TRAIN_TRANSFORMER TRAIN_STEPS SCENARIO
# SCENARIO:
#   train         2 x 2 ranks train the main job's transformer; it checks parity with a single
#                 process itself (exit 1 otherwise); GLOO_SOCKET_IFNAME unset, FSDPP_STORE_SECRET set
#   train-ifname  the same with GLOO_SOCKET_IFNAME set to each node's veth
#   kill-node1    once every rank trains, node 1's launcher is SIGKILLed (its ranks die with it):
#                 node 0 must exit non-zero within 20 s
#   missing-node  node 1 never starts: node 0 (--timeout 5) fails within 20 s naming ranks 2, 3
#   slurm-launcher  as srun --ntasks-per-node=1 fsdpp-run in a 2-node allocation: each node's
#                 launcher gets only the SLURM_* variables srun sets (the node list as addresses,
#                 no --nnodes, --node-rank, --master-addr or --master-port), and the job trains
#   slurm-direct  as srun --ntasks-per-node=2 train_transformer: four ranks, no launcher, each with
#                 SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, ...; init_process_group forms the job
# The namespaces come from namespaces.sh; every wait has a deadline.
set -u
run=$1 transformer=$2 steps=$3 scenario=$4
. "$(dirname "$0")/namespaces.sh"

port=29731
timeout=30  # fsdpp-run --timeout: no wait below can hang for long
# node NODE_RANK PROGRAM [ENV...]: starts a node's launcher in its namespace, in the background.
node() {
  r=$1 program=$2
  shift 2
  ns=$(ns_of "$r")
  # A simple command, not in_ns: $! must be fsdpp-run itself (nsenter and env exec it), not a
  # subshell running a function.
  nsenter --net="/run/netns/$ns" env D="$work" OPENBLAS_NUM_THREADS=1 "$@" \
    "$run" --nnodes 2 --node-rank "$r" --nproc-per-node 2 --master-addr 10.231.7.1 --master-port $port \
    --timeout "$timeout" "$program" >"$work/node$r.log" 2>&1 &
  echo $! >"$work/launcher.$r"
}

# slurm_env NODE: what srun sets in every task of a 2-node step (the per-task ones come later).
slurm_env() {
  echo SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_JOB_NODELIST=10.231.7.[1-2] SLURM_NNODES=2 SLURM_NODEID=$1
}

case $scenario in
  train|train-ifname)
    if [ "$scenario" = train-ifname ]; then
      node 0 "$transformer" GLOO_SOCKET_IFNAME="fv0-$id"
      node 1 "$transformer" GLOO_SOCKET_IFNAME="fv1-$id"
    else
      # The ranks' keys under a secret (rank 0 serves the store): every rank must agree on it.
      node 0 "$transformer" FSDPP_STORE_SECRET=two-nodes-test-secret && node 1 "$transformer" FSDPP_STORE_SECRET=two-nodes-test-secret
    fi
    await "$(cat "$work/launcher.0")" 240; c0=$?
    await "$(cat "$work/launcher.1")" 30; c1=$?
    [ $c0 -eq 0 ] && [ $c1 -eq 0 ] || fail "exit codes $c0 (node 0), $c1 (node 1)"
    grep -q "OK: 20 steps; FSDP losses equal single-process training" "$work/node0.log" || fail "no parity line"
    show | grep -E "OK:|peak tensor memory" ;;
  kill-node1)
    node 0 "$steps" && node 1 "$steps"
    i=0
    until [ -e "$work/pid.0" ] && [ -e "$work/pid.1" ] && [ -e "$work/pid.2" ] && [ -e "$work/pid.3" ]; do
      i=$((i + 1)); [ $i -gt 1200 ] && fail "the ranks did not all start training within 120 s"; sleep 0.1
    done
    kill -KILL "$(cat "$work/launcher.1")"
    start=$(date +%s)
    await "$(cat "$work/launcher.0")" 20; c0=$?
    took=$(($(date +%s) - start))
    [ $c0 -ne 124 ] || fail "node 0 still running 20 s after node 1 was killed"
    [ $c0 -ne 0 ] || fail "node 0 exited 0 without its peers"
    for p in $(cat "$work/pid.2" "$work/pid.3"); do alive "$p" && fail "rank pid $p of node 1 survived"; done
    show | grep -E "fsdpp-run|failed" | head -8
    echo "two_nodes: node 0 ended with exit code $c0, $took s after node 1 was killed" ;;
  missing-node)
    start=$(date +%s)
    timeout=5
    node 0 "$steps"
    await "$(cat "$work/launcher.0")" 20; c0=$?
    took=$(($(date +%s) - start))
    [ $c0 -ne 124 ] || fail "node 0 still running 20 s after it started alone"
    [ $c0 -ne 0 ] || fail "node 0 exited 0 alone"
    grep -q "rank(s) \[2, 3\] did not arrive" "$work/node0.log" || fail "ranks 2 and 3 not named"
    show | grep -E "did not arrive" | head -2
    echo "two_nodes: node 0 alone ended with exit code $c0 after $took s" ;;
  slurm-launcher)
    for r in 0 1; do
      ns=$(ns_of "$r")
      # shellcheck disable=SC2046
      nsenter --net="/run/netns/$ns" env OPENBLAS_NUM_THREADS=1 $(slurm_env $r) SLURM_NTASKS=2 SLURM_PROCID=$r \
        SLURM_LOCALID=0 "$run" --nproc-per-node 2 --timeout "$timeout" "$transformer" >"$work/node$r.log" 2>&1 &
      echo $! >"$work/launcher.$r"
    done
    await "$(cat "$work/launcher.0")" 240; c0=$?
    await "$(cat "$work/launcher.1")" 30; c1=$?
    [ $c0 -eq 0 ] && [ $c1 -eq 0 ] || fail "exit codes $c0 (node 0), $c1 (node 1)"
    grep -q "Slurm job 4242: node 1 of 2, the store at 10.231.7.1:19242" "$work/node1.log" || fail "no Slurm line"
    grep -q "OK: 20 steps; FSDP losses equal single-process training" "$work/node0.log" || fail "no parity line"
    grep -q "1/N = 0.250" "$work/node0.log" || fail "not one world of 4 ranks"
    show | grep -E "Slurm job|OK:" ;;
  slurm-direct)
    for p in 0 1 2 3; do
      r=$((p / 2))
      ns=$(ns_of "$r")
      # shellcheck disable=SC2046
      nsenter --net="/run/netns/$ns" env -u RANK -u WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT OPENBLAS_NUM_THREADS=1 \
        OMP_NUM_THREADS=1 FSDPP_TIMEOUT_SECONDS=$timeout $(slurm_env $r) SLURM_NTASKS=4 SLURM_PROCID=$p \
        SLURM_LOCALID=$((p % 2)) SLURM_TASKS_PER_NODE="2(x2)" "$transformer" >"$work/task$p.log" 2>&1 &
      echo $! >"$work/pid.$p"
    done
    for p in 0 1 2 3; do
      await "$(cat "$work/pid.$p")" 240; c=$?
      [ $c -eq 0 ] || { cat "$work"/task?.log; fail "task $p exited with code $c"; }
    done
    grep -q "OK: 20 steps; FSDP losses equal single-process training" "$work/task0.log" ||
      { cat "$work"/task?.log; fail "no parity line"; }
    grep -q "1/N = 0.250" "$work/task0.log" || { cat "$work"/task?.log; fail "not one world of 4 ranks"; }
    grep -h -E "OK:|1/N" "$work/task0.log" ;;
  *) echo "two_nodes: unknown scenario $scenario"; exit 2 ;;
esac
echo "two_nodes: $scenario passed"

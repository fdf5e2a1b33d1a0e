#!/bin/sh
# fsdpp-run's elastic rendezvous across two "nodes" (network namespaces, namespaces.sh): each
# node's launcher starts 2 ranks, meets the other at --rdzv-endpoint 10.231.7.1 (node 0 serves
# the store), and the job re-forms when the nodes change.
#   elastic_nodes.sh FSDPP_RUN TRAIN_GPT TRAIN_TRANSFORMER STORE_STRANGER SCENARIO
# SCENARIO:
#   lose-node  --nnodes 1:2: both nodes train train_gpt (a checkpoint every 2 steps); at step 4 or
#              later every rank is stopped (SIGSTOP, so the moment is exact), node 1's launcher is
#              SIGKILLed and node 0's ranks continued: node 0 re-forms alone (world 2), resumes
#              from the newest complete checkpoint (step 2 or later: the step-4 one may still have
#              been written in the background) and finishes all 60 steps, exit 0
#   join       --nnodes 1:2: node 0 trains alone (world 2); at step 4 or later its ranks are
#              stopped and node 1's launcher starts: node 0 sees it waiting, its ranks save on
#              SIGTERM (exit 75), both form the next round (world 4), resume from that checkpoint
#              and finish, exit 0 on both
#   stranger   --nnodes 2 with FSDPP_STORE_SECRET: a third namespace connects to the store while
#              the job's ranks are stopped after step 0, reads every key a job without a secret
#              would use (the launchers' and the ranks' first ones) and forges the
#              ones that would end it; it must read nothing, and the job (train_transformer,
#              which checks parity with one process itself) must finish
set -u
run=$1 gpt=$2 transformer=$3 stranger=$4 scenario=$5
[ "$scenario" = stranger ] && THIRD_NAMESPACE=1
. "$(dirname "$0")/namespaces.sh"

endpoint=10.231.7.1:29741
# English-like text a tiny model learns from (tests/trainer/test_train_gpt.py's kind).
awk 'BEGIN { srand(7)
  ns = split("the cat|a dog|my neighbour|the old king|a small bird|the river|our teacher", S, "|")
  nv = split("sees|follows|remembers|carries|paints|forgets|answers", V, "|")
  no = split("the moon|a red apple|the long road|an open door|the winter sky|a quiet song", O, "|")
  while (n < 120000) {
    s = S[int(rand() * ns) + 1] " " V[int(rand() * nv) + 1] " " O[int(rand() * no) + 1] "."
    s = toupper(substr(s, 1, 1)) substr(s, 2) (rand() < 0.2 ? "\n" : " ")
    printf "%s", s; n += length(s)
  } }' >"$work/corpus.txt"
gpt_flags="--data $work/corpus.txt --device cpu --layers 2 --dim 32 --heads 2 --seq 32 --batch 12 --steps 60
  --warmup 3 --lr 3e-3 --log-every 1 --eval-every 1000 --ckpt-every 2 --ckpt-dir $work/run --sample-tokens 0"

# node NAME NODE_NNODES PROGRAM...: a launcher in NAME's namespace (node0, node1: n0, n1), in the
# background, logging to $work/NAME.log.
node() {
  name=$1 nnodes=$2
  shift 2
  ns=$n0
  [ "$name" = node1 ] && ns=$n1
  nsenter --net="/run/netns/$ns" env OPENBLAS_NUM_THREADS=1 "$run" --nnodes "$nnodes" --nproc-per-node 2 \
    --rdzv-endpoint $endpoint --rdzv-id elastic-test --rdzv-conf last_call_timeout=2,join_timeout=60 \
    --max-restarts 1 --timeout 30 "$@" >"$work/$name.log" 2>&1 &
  echo $! >"$work/launcher.$name"
}
launcher() { cat "$work/launcher.$1"; }
ranks_of() { pgrep -P "$(launcher "$1")"; }

case $scenario in
  lose-node)
    # shellcheck disable=SC2086
    node node0 1:2 "$gpt" $gpt_flags
    # shellcheck disable=SC2086
    node node1 1:2 "$gpt" $gpt_flags
    await_line "$work/node0.log" "world of 4" 60
    await_line "$work/node0.log" "step +4/60" 120
    # shellcheck disable=SC2046
    kill -STOP $(ranks_of node0) $(ranks_of node1)
    kill -KILL "$(launcher node1)"
    # shellcheck disable=SC2046
    kill -CONT $(ranks_of node0)
    await "$(launcher node0)" 120; c0=$?
    [ $c0 -eq 0 ] || fail "node 0 exited with code $c0 after node 1 was lost"
    grep -q "rendezvous round 1 at $endpoint: node 0 of 1, ranks 0-1 of a world of 2" "$work/node0.log" ||
      fail "node 0 did not re-form alone"
    grep -E -q "resumed from \S+ \(step ([2-9]|[1-5][0-9])\)" "$work/node0.log" || fail "no resume from step 2 or later"
    grep -E -q "step +60/60 \| loss" "$work/node0.log" || fail "node 0 did not train to step 60"
    [ -f "$work/run/model.safetensors" ] || fail "no final model"
    grep -E "rendezvous round|re-forming|resumed from" "$work/node0.log" ;;
  join)
    # shellcheck disable=SC2086
    node node0 1:2 "$gpt" $gpt_flags
    await_line "$work/node0.log" "world of 2" 60
    await_line "$work/node0.log" "step +4/60" 120
    # shellcheck disable=SC2046
    kill -STOP $(ranks_of node0)
    # shellcheck disable=SC2086
    node node1 1:2 "$gpt" $gpt_flags
    await "$(launcher node0)" 120; c0=$?
    await "$(launcher node1)" 30; c1=$?
    [ $c0 -eq 0 ] && [ $c1 -eq 0 ] || fail "exit codes $c0 (node 0), $c1 (node 1)"
    grep -q "node(s) waiting to join; stopping the ranks (SIGTERM" "$work/node0.log" || fail "node 0 did not see node 1 waiting"
    grep -q "rendezvous round 1 at $endpoint: node [01] of 2, ranks [0-3]-[0-3] of a world of 4" "$work/node1.log" ||
      fail "node 1 was not admitted to round 1"
    grep -E -q "exited with code 75|preempted" "$work/node0.log" || fail "node 0's ranks did not save on SIGTERM"
    grep -E -q "resumed from \S+ \(step ([2-9]|[1-5][0-9])\)" "$work/node0.log" "$work/node1.log" ||
      fail "round 1 did not resume from step 2 or later"
    grep -E -q "step +60/60 \| loss" "$work/node0.log" "$work/node1.log" || fail "the job did not train to step 60"
    show | grep -E "rendezvous round|waiting to join|resumed from" ;;
  stranger)
    export FSDPP_STORE_SECRET
    FSDPP_STORE_SECRET=$(head -c 24 /dev/urandom | base64 | tr '/+' '_-')
    node node0 2 "$transformer"
    node node1 2 "$transformer"
    # Once the ranks train, their keys exist too; stopped, they cannot finish while it looks.
    await_line "$work/node0.log" "step +0 +loss" 120
    # shellcheck disable=SC2046
    kill -STOP $(ranks_of node0) $(ranks_of node1)
    in_ns "$n2" timeout 30 "$stranger" 10.231.7.1 29741 elastic-test >"$work/stranger.log" 2>&1; cs=$?
    # shellcheck disable=SC2046
    kill -CONT $(ranks_of node0) $(ranks_of node1)
    await "$(launcher node0)" 240; c0=$?
    await "$(launcher node1)" 30; c1=$?
    cat "$work/stranger.log"
    [ $cs -eq 0 ] || fail "the stranger read keys of the job (exit code $cs)"
    grep -q "stranger: read 0 of" "$work/stranger.log" || fail "the stranger did not reach the store"
    [ $c0 -eq 0 ] && [ $c1 -eq 0 ] || fail "exit codes $c0 (node 0), $c1 (node 1) after the stranger's forgeries"
    grep -q "OK: 20 steps; FSDP losses equal single-process training" "$work/node0.log" || fail "no parity line"
    ! grep -q -F "$FSDPP_STORE_SECRET" "$work"/node*.log || fail "a log holds the secret" ;;
  *) echo "elastic_nodes: unknown scenario $scenario"; exit 2 ;;
esac
echo "elastic_nodes: $scenario passed"

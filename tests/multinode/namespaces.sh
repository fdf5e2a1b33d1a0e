# Sourced by the multi-node tests: "nodes" as network namespaces on one machine, joined by a veth
# pair (n0 10.231.7.1, n1 10.231.7.2; nothing else is reachable from them), and the waits they
# share. With THIRD_NAMESPACE=1 also n2 (10.231.8.2), a stranger's machine: a second veth pair to
# n0 and a route through it to 10.231.7.0/24. Needs root and iproute2 (exit 77, a skip,
# otherwise). The namespaces are removed whatever happens.
me=$(basename "$0" .sh)
[ "$(id -u)" -eq 0 ] || { echo "$me: needs root (network namespaces)"; exit 77; }
command -v ip >/dev/null || { echo "$me: needs iproute2"; exit 77; }

id=$$
n0=fsdpp-n0-$id n1=fsdpp-n1-$id n2=fsdpp-n2-$id
work=$(mktemp -d)
cleanup() {
  for p in $(cat "$work"/launcher.* "$work"/pid.? 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  for n in "$n0" "$n1" "$n2"; do ip netns del "$n" 2>/dev/null; done  # takes the veth pairs with them
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ip netns add "$n0" && ip netns add "$n1" || { echo "$me: cannot make namespaces"; exit 77; }
ip link add "fv0-$id" type veth peer name "fv1-$id" || exit 1
ip link set "fv0-$id" netns "$n0" && ip link set "fv1-$id" netns "$n1" || exit 1
# in_ns NS CMD...: CMD in NS's network namespace only. Not `ip -n` / `ip netns exec`: they also
# remount / and /sys, which fails in a chroot (the Debian 13 leg of CI runs in one).
in_ns() {
  ns=$1
  shift
  nsenter --net="/run/netns/$ns" "$@"
}
in_ns "$n0" ip addr add 10.231.7.1/24 dev "fv0-$id" && in_ns "$n1" ip addr add 10.231.7.2/24 dev "fv1-$id" || exit 1
for n in "$n0" "$n1"; do in_ns "$n" ip link set lo up; done
in_ns "$n0" ip link set "fv0-$id" up && in_ns "$n1" ip link set "fv1-$id" up || exit 1
if [ "${THIRD_NAMESPACE:-0}" = 1 ]; then
  ip netns add "$n2" && ip link add "fw0-$id" type veth peer name "fw2-$id" || exit 1
  ip link set "fw0-$id" netns "$n0" && ip link set "fw2-$id" netns "$n2" || exit 1
  in_ns "$n0" ip addr add 10.231.8.1/24 dev "fw0-$id" && in_ns "$n2" ip addr add 10.231.8.2/24 dev "fw2-$id" || exit 1
  in_ns "$n0" ip link set "fw0-$id" up && in_ns "$n2" ip link set "fw2-$id" up && in_ns "$n2" ip link set lo up || exit 1
  in_ns "$n2" ip route add 10.231.7.0/24 via 10.231.8.1 || exit 1
fi

# ns_of NODE: the namespace node NODE runs in.
ns_of() { if [ "$1" -eq 1 ]; then echo "$n1"; else echo "$n0"; fi; }

# await PID SECONDS: its exit code, or 124 (after killing it) if still running at the deadline.
await() {
  i=0
  while kill -0 "$1" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt $(($2 * 10)) ]; then kill -KILL "$1"; wait "$1" 2>/dev/null; return 124; fi
    sleep 0.1
  done
  wait "$1"
}

# alive PID: still running 2 s from now (a zombie is gone: PID 1 here may never reap orphans).
alive() {
  i=0
  while kill -0 "$1" 2>/dev/null && [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != Z ]; do
    i=$((i + 1)); [ $i -gt 20 ] && return 0; sleep 0.1
  done
  return 1
}

# await_line FILE REGEX SECONDS: waits until FILE has a line matching REGEX; fails at the deadline.
await_line() {
  i=0
  until grep -q -E "$2" "$1" 2>/dev/null; do
    i=$((i + 1)); [ $i -gt $(($3 * 10)) ] && fail "no line matching '$2' in $(basename "$1") within $3 s"; sleep 0.1
  done
}

show() { for f in "$work"/node*.log; do [ -f "$f" ] && sed "s/^/$(basename "$f" .log): /" "$f"; done; }
fail() { show; echo "$me: FAILED: $*"; exit 1; }

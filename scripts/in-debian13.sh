#!/bin/sh
# Runs CMD... inside a Debian 13 (trixie) root, against Debian's libtorch 2.6
# (FSDPP_LIBTORCH=debian), on this repository, at the same path. The root is made once with
# debootstrap in a cache folder outside the repository (FSDPP_DEBIAN13_ROOT, default
# /var/cache/fsdpp/debian13; about 2 minutes plus packages) and reused after. Builds go to
# build-debian13/ so the two libtorch releases never share a tree.
# Needs root (or sudo).  Example: scripts/in-debian13.sh scripts/run-tests.sh
set -eu
[ $# -ge 1 ] || { echo "usage: $0 CMD [ARGS...]" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${FSDPP_DEBIAN13_ROOT:-/var/cache/fsdpp/debian13}
mirror=${FSDPP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
if [ "$(id -u)" -ne 0 ]; then exec sudo -E "$0" "$@"; fi
# Mounts are made in a private mount namespace: they vanish with this command, and concurrent
# invocations on the same root cannot unmount each other's /proc.
if [ -z "${FSDPP_IN_MOUNT_NS:-}" ]; then FSDPP_IN_MOUNT_NS=1 exec unshare --mount --propagation private "$0" "$@"; fi

if [ ! -f "$root/.fsdpp-ready" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; }
  echo "in-debian13: making a Debian 13 root in $root (once)"
  rm -rf "$root"; mkdir -p "$root"
  debootstrap --variant=minbase trixie "$root" "$mirror" >"$root.log" 2>&1 || {
    tail -n 20 "$root.log" >&2; echo "in-debian13: debootstrap failed (log: $root.log)" >&2; exit 1; }
  touch "$root/.fsdpp-ready"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

bind() {  # bind SRC at the same path inside the root
  mkdir -p "$root$1"
  mount --bind "$1" "$root$1"
}
mount -t proc proc "$root/proc"
bind /dev
bind /dev/pts
bind /dev/shm
bind /tmp
bind "$repo"

cmd=""
for a in "$@"; do cmd="$cmd '$(printf '%s' "$a" | sed "s/'/'\\\\''/g")'"; done
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" FSDPP_LIBTORCH=debian FSDPP_BUILD_DIR=build-debian13 \
  ${OPENBLAS_NUM_THREADS:+OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS} \
  /bin/sh -c "cd '$repo' && $cmd"

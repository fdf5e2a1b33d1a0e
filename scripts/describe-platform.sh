#!/bin/sh
# One line naming what a run used: Debian release, libtorch, and the BLAS libtorch multiplies with.
. /etc/os-release
torch=$(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo "not installed")
blas=$(readlink -f "/usr/lib/$(uname -m)-linux-gnu/libblas.so.3" 2>/dev/null)
case "$blas" in
  *openblas*) blas="OpenBLAS ($blas)" ;;
  *) blas="reference BLAS ($blas)" ;;
esac
echo "Debian ${VERSION_ID:-?} ($(cat /etc/debian_version)), libtorch $torch, $blas, OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"

#!/bin/sh
# One line naming what a run used: Debian release, libtorch (version, where from, CUDA or not),
# and the BLAS libtorch multiplies with.
cd "$(dirname "$0")/.."
. scripts/libtorch.sh
. /etc/os-release
torch=$("$FSDPP_PYTHON" -c 'import torch
cuda = "CUDA-enabled (CUDA " + torch.version.cuda + ")" if torch.version.cuda else "CPU-only"
blas = next((w.split("=")[1].rstrip(",") for w in torch.__config__.show().split() if w.startswith("BLAS_INFO=")), "?")
print(torch.__version__, cuda, blas, sep="|")' 2>/dev/null) || torch="?|?|?"
IFS="|"; set -- $torch; unset IFS
case "$FSDPP_LIBTORCH" in
  pypi) from="PyPI's torch $1 ($FSDPP_TORCH_VENV)"; blas=$3 ;;
  *) from="Debian's libtorch-dev $(dpkg-query -W -f='${Version}' libtorch-dev 2>/dev/null || echo '?')"
     # Debian's libtorch multiplies through whatever libblas.so.3 is installed.
     blas=$(readlink -f "/usr/lib/$(uname -m)-linux-gnu/libblas.so.3" 2>/dev/null)
     case "$blas" in
       *openblas*) blas="OpenBLAS ($blas)" ;;
       *) blas="reference BLAS ($blas)" ;;
     esac ;;
esac
echo "Debian ${VERSION_ID:-?} ($(cat /etc/debian_version)), libtorch: $from, $2, BLAS: $blas, OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}"

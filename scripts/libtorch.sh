# Sourced by the scripts that build or run against libtorch: which libtorch, and its Python.
#   FSDPP_LIBTORCH=pypi (default): PyTorch's own release from PyPI, FSDPP_TORCH_SPEC (torch==2.15.*),
#     CUDA-enabled, in a virtual environment outside the repository (FSDPP_TORCH_VENV, default
#     ~/.cache/fsdpp/venv-torch-2.15, named after the spec; made by scripts/install-deps.sh),
#     found by CMake through torch.utils.cmake_prefix_path. Build folder: build/.
#   FSDPP_LIBTORCH=debian: Debian's packaged libtorch-dev and python3-torch (Debian 13: 2.6), what
#     scripts/in-debian13.sh uses. Build folder: build-debian13/ (set by in-debian13.sh).
# Sets FSDPP_PYTHON (the Python whose torch matches the libtorch) and defines fsdpp_configure.
FSDPP_LIBTORCH=${FSDPP_LIBTORCH:-pypi}
FSDPP_TORCH_SPEC=${FSDPP_TORCH_SPEC:-torch==2.15.*}
case "$FSDPP_LIBTORCH" in
  pypi)
    FSDPP_TORCH_VENV=${FSDPP_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpp/venv-$(echo "$FSDPP_TORCH_SPEC" |
      sed 's/==*/-/; s/[^A-Za-z0-9.-]//g; s/\.*$//')}
    FSDPP_PYTHON=$FSDPP_TORCH_VENV/bin/python ;;
  debian)
    FSDPP_PYTHON=/usr/bin/python3 ;;
  *) echo "FSDPP_LIBTORCH='$FSDPP_LIBTORCH': expected pypi or debian" >&2; exit 2 ;;
esac
export FSDPP_LIBTORCH FSDPP_TORCH_SPEC FSDPP_PYTHON
[ -z "${FSDPP_TORCH_VENV:-}" ] || export FSDPP_TORCH_VENV

# fsdpp_configure CMAKE_ARGS...: cmake with this libtorch (after install-deps.sh made it). Torch_DIR
# too, so a build folder configured against another libtorch before follows the choice.
fsdpp_configure() {
  if [ "$FSDPP_LIBTORCH" = pypi ]; then
    prefix=$("$FSDPP_PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') || {
      echo "no torch in $FSDPP_PYTHON: run scripts/install-deps.sh" >&2; return 1; }
    # c10_LIBRARY too: TorchConfig finds libc10 with find_library(... PATHS), which searches the
    # system's folders first, so where Debian's libtorch-dev is also installed it linked Debian's
    # libc10.so.2.6 beside the wheel's (two c10 registries: "Key already registered").
    cmake "$@" -DCMAKE_PREFIX_PATH="$prefix" -DTorch_DIR="$prefix/Torch" -Dc10_LIBRARY="$prefix/../../lib/libc10.so" \
      -DFSDPP_PYTHON="$FSDPP_PYTHON"
  else
    cmake "$@" -DFSDPP_PYTHON="$FSDPP_PYTHON"
  fi
}

# Sourced by the scripts that build or run against libtorch: which libtorch, and its Python.
#   FSDPP_LIBTORCH=pypi (default): PyTorch's own release from PyPI, FSDPP_TORCH_SPEC (torch==2.15.*),
#     CUDA-enabled, in a virtual environment outside the repository (FSDPP_TORCH_VENV, default
#     ~/.cache/fsdpp/venv-torch-2.15; made by scripts/install-deps.sh), found by CMake through
#     torch.utils.cmake_prefix_path. Build folder: build/.
#   FSDPP_LIBTORCH=debian: Debian's packaged libtorch-dev and python3-torch (Debian 13: 2.6), what
#     scripts/in-debian13.sh uses. Build folder: build-debian13/ (set by in-debian13.sh).
# Sets FSDPP_PYTHON (the Python whose torch matches the libtorch) and FSDPP_CMAKE_ARGS.
FSDPP_LIBTORCH=${FSDPP_LIBTORCH:-pypi}
FSDPP_TORCH_SPEC=${FSDPP_TORCH_SPEC:-torch==2.15.*}
case "$FSDPP_LIBTORCH" in
  pypi)
    FSDPP_TORCH_VENV=${FSDPP_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdpp/venv-torch-2.15}
    FSDPP_PYTHON=$FSDPP_TORCH_VENV/bin/python ;;
  debian)
    FSDPP_PYTHON=/usr/bin/python3 ;;
  *) echo "FSDPP_LIBTORCH='$FSDPP_LIBTORCH': expected pypi or debian" >&2; exit 2 ;;
esac
export FSDPP_LIBTORCH FSDPP_TORCH_SPEC FSDPP_PYTHON ${FSDPP_TORCH_VENV:+FSDPP_TORCH_VENV}

# The CMake arguments that find this libtorch (after install-deps.sh made it).
fsdpp_cmake_args() {
  if [ "$FSDPP_LIBTORCH" = pypi ]; then
    printf '%s\n' "-DCMAKE_PREFIX_PATH=$("$FSDPP_PYTHON" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
  fi
  printf '%s\n' "-DFSDPP_PYTHON=$FSDPP_PYTHON"
}

# PyTorch's wheel (torch from PyPI) finds its CUDA libraries at run time through libtorch_cuda.so's
# RPATH ($ORIGIN/../../nvidia/*/lib), but the linker resolves them at link time through the system's
# paths first: where the CUDA toolkit put an older libnccl.so.2 in ldconfig's cache, every link
# fails with "libtorch_cuda.so: undefined reference to `ncclCommSuspend'". Pointing -rpath-link at
# the wheel's own nvidia/*/lib folders makes the link see the libraries the program will run with.
# A no-op for a libtorch without those folders (Debian's, pytorch.org's archive). Used by fsdpp's
# build and by its installed package config, so a user's project links the same way.
if(TARGET torch AND DEFINED TORCH_INSTALL_PREFIX)
  file(GLOB _fsdpp_wheel_cuda_libs LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  foreach(_dir IN LISTS _fsdpp_wheel_cuda_libs)
    get_filename_component(_dir "${_dir}" REALPATH)
    set_property(TARGET torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
  endforeach()
  unset(_fsdpp_wheel_cuda_libs)
  unset(_dir)
endif()

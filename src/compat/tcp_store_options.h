#pragma once
// TCPStore options that work on both libtorch lines. libtorch 2.x defaults to the libuv server
// backend, which Debian's build lacks ("use_libuv was requested but PyTorch was build without
// libuv support"); the classic backend exists everywhere and speaks the same protocol.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "compat/torch_version.h"

namespace fsdpp::compat {

inline c10d::TCPStoreOptions tcp_store_options() {
  c10d::TCPStoreOptions options;
#if FSDPP_LIBTORCH_2
  options.useLibUV = false;
#endif
  return options;
}

}  // namespace fsdpp::compat

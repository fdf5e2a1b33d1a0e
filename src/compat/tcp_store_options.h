#pragma once
// TCPStore options for every supported libtorch. Since 2.4 libtorch defaults to the libuv server
// backend, which Debian's build lacks ("use_libuv was requested but PyTorch was build without
// libuv support"); the classic backend exists in every build and speaks the same protocol.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace fsdpp::compat {

inline c10d::TCPStoreOptions tcp_store_options() {
  c10d::TCPStoreOptions options;
  options.useLibUV = false;
  return options;
}

}  // namespace fsdpp::compat

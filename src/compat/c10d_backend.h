#pragma once
// The object fsdpp runs collectives on. libtorch 1.13's ProcessGroupGloo is a c10d::ProcessGroup;
// in 2.x it is a c10d::Backend, and a c10d::ProcessGroup wraps one backend per device type.
// Both spell allreduce / broadcast / alltoall_base / send / recv / barrier the same way.
#include <chrono>
#include <memory>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/torch_version.h"
#if FSDPP_LIBTORCH_2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace gloo::transport {
class Device;
}

namespace fsdpp::compat {

#if FSDPP_LIBTORCH_2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

// A Gloo backend of `size` ranks meeting on `store`, over `device`, with one worker thread.
c10::intrusive_ptr<C10dBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout,
                                                  std::shared_ptr<::gloo::transport::Device> device);

// The c10d::ProcessGroup a PyTorch user would hold for this backend (the backend itself in 1.13).
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<C10dBackend>& backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store);

}  // namespace fsdpp::compat

#pragma once
// The object fsdpp runs collectives on: a c10d::Backend (ProcessGroupGloo), which a
// c10d::ProcessGroup wraps per device type. Everything that needs Gloo's own headers is in
// gloo_backend.cpp, the one translation unit that includes them (docs/building.md says why).
#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace gloo::transport {
class Device;  // only ever held through std::shared_ptr, made and destroyed inside libtorch
}

namespace fsdpp::compat {

using C10dBackend = c10d::Backend;
using GlooDevice = std::shared_ptr<::gloo::transport::Device>;

// c10d's Gloo devices: bound to a named interface (GLOO_SOCKET_IFNAME), to the address of a host
// name or IP, or to what this host's name resolves to (loopback when it resolves to nothing).
GlooDevice gloo_device_for_interface(const std::string& interface);
GlooDevice gloo_device_for_hostname(const std::string& hostname);
GlooDevice gloo_default_device();

// A Gloo backend of `size` ranks meeting on `store`, over `device`, with one worker thread.
c10::intrusive_ptr<C10dBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout, GlooDevice device);

// The c10d::ProcessGroup a PyTorch user would hold for these backends: `backend` (Gloo) for CPU
// tensors, `cuda_backend` (the same Gloo one, or NCCL's when `nccl`) for CUDA tensors.
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<C10dBackend>& backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store,
                                                        const c10::intrusive_ptr<C10dBackend>& cuda_backend, bool nccl);

}  // namespace fsdpp::compat

// The only file that includes c10d's ProcessGroupGloo.hpp, and through it Gloo's headers, which
// PyTorch's libtorch does not ship (docs/building.md). It may hold Gloo objects only through
// pointers made and destroyed inside libtorch: tests/gloo_abi/check_gloo_abi.sh fails if its
// object file defines or calls anything whose code depends on the layout of a Gloo type.
#include "compat/c10d_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace fsdpp::compat {

GlooDevice gloo_device_for_interface(const std::string& interface) {
  return c10d::ProcessGroupGloo::createDeviceForInterface(interface);
}

GlooDevice gloo_device_for_hostname(const std::string& hostname) {
  return c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
}

GlooDevice gloo_default_device() { return c10d::ProcessGroupGloo::createDefaultDevice(); }

c10::intrusive_ptr<C10dBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout, GlooDevice device) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(std::move(device));
  options->threads = 1;  // fsdpp's comm thread already serializes a group's collectives
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<C10dBackend>& backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store,
                                                        const c10::intrusive_ptr<C10dBackend>& cuda_backend, bool nccl) {
  if (!backend) return {};
  using Type = c10d::ProcessGroup::BackendType;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  group->setBackend(c10::DeviceType::CPU, Type::GLOO, backend);
  if (cuda_backend) group->setBackend(c10::DeviceType::CUDA, nccl ? Type::NCCL : Type::GLOO, cuda_backend);
  group->setDefaultBackend(nccl ? Type::NCCL : Type::GLOO);
  return group;
}

}  // namespace fsdpp::compat

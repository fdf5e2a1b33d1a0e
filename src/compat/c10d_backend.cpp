#include "compat/c10d_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

namespace fsdpp::compat {

c10::intrusive_ptr<C10dBackend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout,
                                                  std::shared_ptr<::gloo::transport::Device> device) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(std::move(device));
  options->threads = 1;  // fsdpp's comm thread already serializes a group's collectives
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(const c10::intrusive_ptr<C10dBackend>& backend,
                                                        const c10::intrusive_ptr<c10d::Store>& store) {
  if (!backend) return {};
#if FSDPP_LIBTORCH_2
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, backend);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
#else
  (void)store;
  return backend;
#endif
}

}  // namespace fsdpp::compat

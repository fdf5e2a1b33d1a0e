// comm/fake_backend.h: the fake backend's c10d objects and the exchange it runs instead of one.
#include "comm/fake_backend.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "compat/cuda_runtime.h"

namespace fsdpp::detail {
namespace {

std::atomic<int64_t> g_fake_collective_us{0};

class CompletedWork : public c10d::Work {
 public:
  bool isCompleted() override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
};

c10::intrusive_ptr<c10d::Work> completed() { return c10::make_intrusive<CompletedWork>(); }

// The collectives fsdpp's engine and a user of ProcessGroup::backend() reach; the rest keep
// c10d's "does not support" errors, which name this backend.
class FakeBackend : public c10d::Backend {
 public:
  FakeBackend(int rank, int size) : Backend(rank, size) {}
  const std::string getBackendName() const override { return "fake"; }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>&, const c10d::BroadcastOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>&, std::vector<at::Tensor>&,
                                           const c10d::AllgatherOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                                               const c10d::AllToAllOptions&) override {
    return completed();
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override { return completed(); }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override { return completed(); }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override { return completed(); }
};

}  // namespace

c10::intrusive_ptr<compat::C10dBackend> make_fake_backend(int rank, int size) {
  return c10::make_intrusive<FakeBackend>(rank, size);
}

c10::intrusive_ptr<c10d::ProcessGroup> fake_process_group(const c10::intrusive_ptr<compat::C10dBackend>& backend,
                                                          const c10::intrusive_ptr<c10d::Store>& store) {
  using Type = c10d::ProcessGroup::BackendType;
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, backend->getRank(), backend->getSize());
  group->setBackend(c10::DeviceType::CPU, Type::CUSTOM, backend);
  group->setBackend(c10::DeviceType::CUDA, Type::CUSTOM, backend);
  group->setDefaultBackend(Type::CUSTOM);
  return group;
}

void run_fake_exchange(const at::Tensor& on) {
  const std::chrono::microseconds duration(g_fake_collective_us.load());
  if (duration.count() <= 0) return;
  if (on.defined() && !on.is_cpu())
    compat::cuda_sleep(duration);  // on the current stream: the group's device stream here
  else
    std::this_thread::sleep_for(duration);
}

void set_fake_collective_duration(std::chrono::microseconds duration) { g_fake_collective_us = duration.count(); }

}  // namespace fsdpp::detail

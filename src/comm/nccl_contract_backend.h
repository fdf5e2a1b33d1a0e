#pragma once
// The NCCL-contract double (backend "nccl-contract"): a c10d backend that behaves as
// ProcessGroupNCCL does where fsdpp depends on it, on CPU tensors, so that CPU CI runs the device
// path (comm/device_handoff.h) as a GPU would. Like NCCL it
//  - launches a collective on the caller's current stream when the options ask it (asyncOp =
//    false, 2.7+) and returns a null Work; otherwise after that stream's work so far, returning a
//    Work whose wait() orders the waiting stream after it (2.6's NCCL, on its own stream);
//  - refuses what c10d's NCCL map lacks with its message (a c10::TypeError naming the dtype),
//    and float8 reductions;
//  - runs a communicator's collectives in launch order, each after what its stream queued before
//    the launch, and makes that stream wait for its end. On a CPU comm stream (comm/device_stream.h)
//    the end comes after the launch returns (later still under set_device_collective_delay,
//    comm/device_handoff.h), so a consumer that does not wait reads stale data and a buffer freed
//    too early is read after its free;
//  - has no timeout of its own (NCCL's kernels spin until a blocking wait or the watchdog gives
//    up).
// It records every launch (communicator, collective, sequence number), so a test checks that every
// rank launched one global order across all its communicators. Each communicator exchanges over a
// Gloo backend of its own. Private to fsdpp; for tests.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/c10d_backend.h"

namespace fsdpp::detail {

// The double for one communicator named `communicator` (the group's name), of `size` ranks meeting
// on `store` over `device`.
c10::intrusive_ptr<compat::C10dBackend> make_nccl_contract_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                                   int rank, int size, std::string communicator,
                                                                   const compat::GlooDevice& device);

struct ContractLaunch {
  std::string communicator;
  std::string collective;  // "allreduce", "broadcast", "all_gather_single", "reduce_scatter_single", "alltoall_base"
  int64_t seq = 0;         // within the communicator
  bool operator==(const ContractLaunch& o) const {
    return communicator == o.communicator && collective == o.collective && seq == o.seq;
  }
};

// Testing knobs, process-wide. Every launch of this process so far, in launch order.
std::vector<ContractLaunch> nccl_contract_launches();
void clear_nccl_contract_launches();
// From now on each launch first sleeps a random time up to `jitter` (seeded by rank), so that
// launches from threads racing each other land in different orders on different ranks.
void set_nccl_contract_launch_jitter(std::chrono::microseconds jitter);

}  // namespace fsdpp::detail

#pragma once
// fsdpp::OffloadPolicy and CPUOffloadPolicy (FSDP2's; FSDP1's CPUOffload(offload_params=true)):
// where an FSDP unit keeps its sharded parameters between uses.
//
//   auto opts = fsdpp::FullyShardOptions().offload_policy(fsdpp::CPUOffloadPolicy().pin_memory(false));
//
// With CPU offload the sharded parameters, their `.grad` shards and so the optimizer state live
// in host memory, and the optimizer steps on the CPU. Each all-gather copies the shards to the
// compute device (the device the parameters were on when the module was wrapped) and each
// reduce-scatter's output is copied back to the host. The unsharded parameters, activations
// and gradients during backward stay on the compute device.
namespace fsdpp {

// No offload: the shards stay on the compute device.
struct OffloadPolicy {
  bool offload_to_cpu_ = false;
  // Page-locked host memory, for asynchronous copies to an accelerator. Only applies when the
  // compute device is not the CPU (a CPU-only libtorch cannot pin memory, and nothing is copied).
  bool pin_memory_ = false;
};

struct CPUOffloadPolicy : OffloadPolicy {
  CPUOffloadPolicy() {
    offload_to_cpu_ = true;
    pin_memory_ = true;
  }
  CPUOffloadPolicy& pin_memory(bool v) {
    pin_memory_ = v;
    return *this;
  }
};

}  // namespace fsdpp

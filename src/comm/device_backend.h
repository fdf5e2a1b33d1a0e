#pragma once
// What carries a group's CUDA tensors under a backend string ("gloo", "nccl", "cpu:gloo,cuda:nccl",
// ...): init_process_group checks the string before the rendezvous, and each group's connection
// makes the backend it names. Private to fsdpp.
#include <string>

namespace fsdpp::detail {

// PyTorch's forms: "gloo" (CPU and CUDA tensors over Gloo), "nccl", and device:backend pairs
// such as "cpu:gloo,cuda:nccl". fsdpp's own exchanges (metadata, the intent check) and CPU tensors
// always go over Gloo, so "nccl" alone takes CPU tensors too, where PyTorch's would refuse them.
// "fake" (comm/fake_backend.h) carries both and moves nothing. "nccl-contract"
// (comm/nccl_contract_backend.h, for tests) carries CPU tensors by NCCL's contract, on CPU comm
// streams.
enum class DeviceBackend { kGloo, kNccl, kFake, kNcclContract };

// Throws fsdpp::Error naming the forms fsdpp takes when `backend` is none of them.
DeviceBackend device_backend_of(const std::string& backend);

}  // namespace fsdpp::detail

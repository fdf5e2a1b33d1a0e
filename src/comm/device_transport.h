#pragma once
// The exchanges of collectives that take the device path (comm/device_handoff.h), over the c10d
// backend the group holds for devices: ProcessGroupNCCL (or its contract double on CPU tensors),
// or ProcessGroupGloo, which stages CUDA tensors through pinned host memory. Each runs inside its
// handoff, with the collective's stream current: NCCL queues on it and returns a null Work
// (asyncOp = false), Gloo's Work is waited for on the host. Steps that read what the exchange
// wrote (AVG's division, a widened reduction's copy back, a gather's placement) are queued on the
// same stream after it. Each transport's dtype rules (comm/transport_dtypes.h) are kept: what it
// cannot reduce is widened, what it cannot move travels as bytes. Private to fsdpp.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fsdpp/collectives.h>

#include "comm/gather_layout.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// As collective_algorithms.h's counterparts (AVG divides a sum, as there).
void run_device_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op);
void run_device_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank);
void run_device_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input);
// Gathers rank-major into a temporary, then places each rank's block where `layout` puts it.
void run_device_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                       const GatherLayout& layout);
void run_device_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op);
void run_device_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_elements, const std::vector<int64_t>& input_elements);

}  // namespace fsdpp::detail

#pragma once
// How each collective moves and reduces bytes, run on the group's comm thread once the public
// function (comm/collectives.cpp) has validated, counted and submitted it: over the same-host
// shared-memory transport when the group has one (comm/shm_transport.h), else over Gloo, with
// fsdpp's own ring reduce-scatter and point-to-point all-gather. Both transports give the same
// bits: the shared-memory reductions sum in Gloo's order. Private to fsdpp.
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fsdpp/collectives.h>

#include "comm/gather_layout.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Each runs the whole exchange over `g` (a member) and returns when it is done; AVG divides.
// Tensors that take the device path go through comm/device_transport.h; a fake group's exchange is
// comm/fake_backend.h's run_fake_exchange, on any device.
void run_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op);
void run_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank);
void run_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input);
void run_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                const GatherLayout& layout);
void run_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input, ReduceOp op);
// Split sizes in elements, validated and agreed by the caller.
void run_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                    std::vector<int64_t> output_elements, std::vector<int64_t> input_elements);
void run_barrier(const ProcessGroupImpl& g);
// The root's `bytes` to every member: its length, then (if any) its bytes.
void run_broadcast_bytes(const ProcessGroupImpl& g, std::string& bytes, int root_group_rank);

}  // namespace fsdpp::detail

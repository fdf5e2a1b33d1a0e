#pragma once
// Collectives with PyTorch's names and argument order (torch.distributed.*).
// Each runs synchronously, or with async_op = true returns a Work to wait on.
// All tensors must be contiguous and on the group's device; `src` is a global rank,
// as in PyTorch. An empty `group` means the default group.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

namespace fsdpp {

enum class ReduceOp { SUM, AVG, MIN, MAX };

Work all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                const ProcessGroup& group = {}, bool async_op = false);

Work broadcast(const at::Tensor& tensor, int src, const ProcessGroup& group = {},
               bool async_op = false);

// output holds group.size() chunks of input's size, in rank order.
Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input,
                            const ProcessGroup& group = {}, bool async_op = false);

// input holds group.size() chunks of output's size; rank r gets the reduction of chunk r.
Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::SUM, const ProcessGroup& group = {},
                           bool async_op = false);

// Split sizes count rows of dim 0; empty means equal splits.
Work all_to_all_single(const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_split_sizes = {},
                       const std::vector<int64_t>& input_split_sizes = {},
                       const ProcessGroup& group = {}, bool async_op = false);

Work barrier(const ProcessGroup& group = {}, bool async_op = false);

// Broadcasts a byte string (a serialized object) from src; other ranks' `bytes` is replaced.
// With async_op, `bytes` must outlive the Work.
Work broadcast_bytes(std::string& bytes, int src, const ProcessGroup& group = {},
                     bool async_op = false);

const char* to_string(ReduceOp op);

}  // namespace fsdpp

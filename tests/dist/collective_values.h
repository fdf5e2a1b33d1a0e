#pragma once
// What the collective tests send and expect (tests/dist/test_collectives.cpp over Gloo and shared
// memory, tests/dist/test_nccl_contract.cpp over the NCCL-contract double): values each rank can
// compute alone for every rank.
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>

namespace fsdpp::testing {

// Small integers, so every sum is exact even in bfloat16 and int8.
inline at::Tensor rank_values(int rank, int64_t numel, at::ScalarType dtype) {
  return (at::arange(numel, at::kLong) % 7 * (rank + 1) + rank).to(dtype);
}

// `op` over every rank's rank_values, in `dtype`.
inline at::Tensor reduce_reference(int world_size, int64_t numel, at::ScalarType dtype, ReduceOp op) {
  std::vector<at::Tensor> all;
  for (int r = 0; r < world_size; ++r) all.push_back(rank_values(r, numel, at::kDouble));
  const at::Tensor stacked = at::stack(all);
  switch (op) {
    case ReduceOp::SUM: return stacked.sum(0).to(dtype);
    case ReduceOp::AVG: return (stacked.sum(0) / world_size).to(dtype);
    case ReduceOp::MIN: return std::get<0>(stacked.min(0)).to(dtype);
    case ReduceOp::MAX: return std::get<0>(stacked.max(0)).to(dtype);
  }
  return {};
}

inline std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (at::isFloatingType(dtype)) return {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MIN, ReduceOp::MAX};
  return {ReduceOp::SUM, ReduceOp::MIN, ReduceOp::MAX};
}

}  // namespace fsdpp::testing

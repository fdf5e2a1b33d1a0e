#pragma once
// What each transport reduces and moves, by dtype. Gloo rejects bfloat16 and int16; c10d's NCCL
// map (NCCLUtils.hpp) has no int16 and no unsigned type wider than 8 bits, and reduces no float8.
// What a transport cannot reduce is widened by the caller; what it cannot move travels as bytes
// of a dtype it takes (no arithmetic happens on them). Private to fsdpp.
#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <fsdpp/collectives.h>

namespace fsdpp::detail {

// A flat view of the same bytes as a dtype Gloo moves.
at::Tensor as_wire(const at::Tensor& t);
// Whether Gloo's all_reduce reduces this dtype itself (not bfloat16, int16, bool, complex).
bool gloo_can_reduce(at::ScalarType t);

// Whether c10d's NCCL backend moves / reduces this dtype.
bool nccl_can_move(at::ScalarType t);
bool nccl_can_reduce(at::ScalarType t);
// A flat view of `t` NCCL moves: itself, or its bytes.
at::Tensor as_nccl_wire(const at::Tensor& t);
// The dtype a reduction of `t` runs in where its own is not reduced: float32 for a floating
// type, int64 otherwise (a sum modulo 2^k and min/max come back exact when cast back).
at::ScalarType widened(at::ScalarType t);

// c10d's op for a reduction; AVG is a SUM the caller divides.
c10d::ReduceOp to_c10d(ReduceOp op);

}  // namespace fsdpp::detail

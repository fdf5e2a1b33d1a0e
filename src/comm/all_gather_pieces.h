#pragma once
// An all-gather whose output is not rank-major: each rank's input is cut into pieces, and rank
// q's piece i lands at `output_offset + q * numel` of the output, received there directly (a
// point-to-point message per piece and peer). FSDP gathers a unit this way straight into its
// unsharded parameters, where every parameter's rows are contiguous, instead of gathering
// rank-major and copying out. Private to fsdpp.
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

namespace fsdpp::detail {

struct GatherPiece {
  int64_t input_offset = 0;   // elements, the same on every rank
  int64_t numel = 0;          // elements each rank contributes
  int64_t output_offset = 0;  // where rank 0's piece lands; rank q's at output_offset + q * numel
};

// Counted by CommDebugMode, numbered, checked across ranks and traced as an
// all_gather_into_tensor of the same tensors (it moves the same bytes). The pieces must be the
// same on every rank; output must hold group.size() x input elements.
Work all_gather_into_pieces(const at::Tensor& output, const at::Tensor& input, const std::vector<GatherPiece>& pieces,
                            const ProcessGroup& group, bool async_op);

}  // namespace fsdpp::detail

#pragma once
// fsdpp's own agreements between ranks (FSDP's backward prefetch decision): collectives
// numbered, checked and traced as any other, but not counted by CommDebugMode, which counts
// the collectives of the user's training (as it leaves out the intent check's exchange).
// Private to fsdpp.
#include <ATen/core/Tensor.h>

#include <fsdpp/collectives.h>
#include <fsdpp/process_group.h>

namespace fsdpp::detail {

// all_reduce(tensor, op, group), synchronous.
void metadata_all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group);

}  // namespace fsdpp::detail

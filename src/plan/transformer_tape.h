#pragma once
// The forward of a transformer and its loss as a Tape (autograd_tape.h), op by op as libtorch's
// autograd runs it on one TP rank: what each op allocates, what it saves, which C++ locals keep
// tensors alive, and which parameter gradients its backward makes. Units: 0 the root
// (embeddings, then final norm and output projection), 1 + i block i, -1 the loss.
#include <fsdpp/plan.h>

#include "plan/autograd_tape.h"

namespace fsdpp::plan::detail {

// `value_bytes`: bytes per element of activations and gradients (the units' param_dtype).
Tape transformer_tape(const ModelShape& model, int64_t tensor_parallel, int64_t value_bytes);

}  // namespace fsdpp::plan::detail

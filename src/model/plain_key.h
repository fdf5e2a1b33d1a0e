#pragma once
// The plain-key rule: a module's, parameter's or buffer's name in the user's model without
// fsdpp's wrappers, the name state dicts key it by (ModelLayout) and deferred init seeds it by.
// PyTorch's FSDP and CheckpointWrapper state-dict hooks leave their wrappers' own segments out
// the same way, so a plain model loads a wrapped one's state dict and vice versa. Private to
// fsdpp.
#include <string>

namespace fsdpp::detail {

// The plain name of `segment` (a child module's, parameter's or buffer's name) under `parent`
// (a plain name; "" for the root): "parent.segment", "segment" under the root, and `parent`
// itself when `segment` is a wrapper's own (`_fsdp_wrapped_module`, `_checkpoint_wrapped_module`).
std::string plain_name(const std::string& parent, const std::string& segment);

}  // namespace fsdpp::detail

#pragma once
// sync_module_states' one path (FSDP's `_sync_module_states`): the source rank, rank 0 of the
// shard group that is also rank 0 of the replicate group (HSDP), gives its values to every rank
// along the shard group, then along the replicate group. A unit's parameters
// (fsdp_param_group_init.cpp) and the buffers no unit shards (fsdp_module.cpp) both take it.
#include <string>

#include <ATen/core/Tensor.h>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

// Whether this rank's values are the ones every rank takes; `replicate` may be undefined.
bool is_sync_source(const ProcessGroup& shard, const ProcessGroup& replicate);

// Whether the source holds values, agreed along the path before any value is sent, so that
// every rank fails alike (naming `unit` and `what`) instead of waiting for values never sent.
void agree_source_has_values(bool source_has_values, const ProcessGroup& shard, const ProcessGroup& replicate,
                             const std::string& unit, const std::string& what);

// `t` from the source to every rank, along the shard group, then the replicate group.
void broadcast_along_sync_path(const at::Tensor& t, const ProcessGroup& shard, const ProcessGroup& replicate);

}  // namespace fsdpp::detail

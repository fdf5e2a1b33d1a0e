#include "fsdp/sync_module_states.h"

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

namespace fsdpp::detail {

bool is_sync_source(const ProcessGroup& shard, const ProcessGroup& replicate) {
  return shard.rank() == 0 && (!replicate.defined() || replicate.rank() == 0);
}

void broadcast_along_sync_path(const at::Tensor& t, const ProcessGroup& shard, const ProcessGroup& replicate) {
  for (const ProcessGroup* group : {&shard, &replicate})
    if (group->defined()) broadcast(t, group->global_rank(0), *group);
}

void agree_source_has_values(bool source_has_values, const ProcessGroup& shard, const ProcessGroup& replicate,
                             const std::string& unit, const std::string& what) {
  at::Tensor flag = at::full({1}, source_has_values ? 1 : 0, at::kInt);
  broadcast_along_sync_path(flag, shard, replicate);
  if (flag.item<int>() != 1)
    throw Error("fully_shard of " + unit + " with sync_module_states: rank 0 holds no values for " + what +
                " (it was built under deferred_init); rank 0 must build the model with its values");
}

}  // namespace fsdpp::detail

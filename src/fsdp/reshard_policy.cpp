#include <fsdpp/reshard_policy.h>

#include <fsdpp/error.h>

namespace fsdpp {

void ReshardPolicy::check(int group_size, const std::string& unit, const std::string& group) const {
  if (ways_ == kFully || ways_ == 1) return;
  const std::string where = "fully_shard of " + unit + ": reshard_after_forward = " + std::to_string(ways_);
  if (ways_ < 1)  // PyTorch refuses 0 too: it would mean neither true nor a group size
    throw Error(where + " is not allowed: pass a bool or an int k >= 1 dividing the shard group's size " +
                std::to_string(group_size) + " (group " + group + ")");
  if (group_size % ways_ != 0)
    throw Error(where + " must divide the shard group's size " + std::to_string(group_size) + " (group " + group + ")");
}

}  // namespace fsdpp

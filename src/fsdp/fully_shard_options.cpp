#include <fsdpp/fully_shard_options.h>

#include <fsdpp/error.h>

namespace fsdpp {

void MixedPrecisionPolicy::check(const std::string& unit) const {
  auto require_floating = [&](const std::optional<at::ScalarType>& dtype, const char* field) {
    if (dtype && !at::isFloatingType(*dtype))
      throw Error("fully_shard of " + unit + ": mp_policy " + field + " " + c10::toString(*dtype) +
                  " is not a floating-point dtype");
  };
  require_floating(param_dtype_, "param_dtype");
  require_floating(reduce_dtype_, "reduce_dtype");
  require_floating(output_dtype_, "output_dtype");
}

void ReshardPolicy::check(int group_size, const std::string& unit, const std::string& group) const {
  if (fully_ || ways_ == 1) return;
  const std::string where = "fully_shard of " + unit + ": reshard_after_forward = " + std::to_string(ways_);
  if (ways_ < 1)  // PyTorch refuses 0 too: it would mean neither true nor a group size
    throw Error(where + " is not allowed: pass a bool or an int k >= 1 dividing the shard group's size " +
                std::to_string(group_size) + " (group " + group + ")");
  if (group_size % ways_ != 0)
    throw Error(where + " must divide the shard group's size " + std::to_string(group_size) + " (group " + group + ")");
}

std::string ReshardPolicy::to_string() const {
  if (fully_) return "true";
  if (ways_ == 1) return "false";
  return std::to_string(ways_);
}

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::FULL_SHARD: return "FULL_SHARD";
    case ShardingStrategy::SHARD_GRAD_OP: return "SHARD_GRAD_OP";
    case ShardingStrategy::NO_SHARD: return "NO_SHARD";
    case ShardingStrategy::HYBRID_SHARD: return "HYBRID_SHARD";
  }
  return "?";
}

}  // namespace fsdpp

#pragma once
// fsdpp::ReshardPolicy: what an FSDP unit does with its gathered parameters after forward.
#include <string>

namespace fsdpp {

// FSDP2's reshard_after_forward, kept as one value: true (free the gathered parameters after
// forward and gather them again for backward), false (keep them until backward), or an int k
// (keep a copy sharded k ways across k consecutive ranks of the group, so backward gathers
// within those k ranks only). k = 1 means false and k = the group size means true; k must
// divide the group size, and 0 is refused, as PyTorch does.
class ReshardPolicy {
 public:
  ReshardPolicy(bool reshard = true) : ways_(reshard ? kFully : 1) {}  // NOLINT: implicit, as the bool it stands for
  static ReshardPolicy ways(int k) {
    ReshardPolicy p;
    p.ways_ = k;
    return p;
  }
  // Whether the unsharded parameters are freed after forward.
  bool reshards() const { return ways_ != 1; }
  // k of the copy kept after forward; 0 when none is kept (true, false, or k = group size).
  int post_forward_size(int group_size) const { return ways_ > 1 && ways_ < group_size ? ways_ : 0; }
  // Throws naming `unit` and the group unless this is a bool or a positive divisor of group_size.
  void check(int group_size, const std::string& unit, const std::string& group) const;

 private:
  static constexpr int kFully = -1;
  int ways_;
};

}  // namespace fsdpp

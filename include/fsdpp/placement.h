#pragma once
// How a tensor lies along one dimension of a device mesh (PyTorch DTensor's placements):
// Shard(d), split along tensor dim d as torch.chunk splits it, or Replicate, whole on each rank.
#include <cstdint>
#include <string>

namespace fsdpp {

class Placement {
 public:
  static Placement shard(int64_t dim) { return Placement(dim); }
  static Placement replicate() { return Placement(-1); }

  bool is_shard() const { return dim_ >= 0; }
  bool is_replicate() const { return dim_ < 0; }
  // The sharded tensor dimension (is_shard() only).
  int64_t dim() const { return dim_; }
  // "Shard(0)" / "Replicate()", as PyTorch prints them.
  std::string to_string() const {
    return is_shard() ? "Shard(" + std::to_string(dim_) + ")" : std::string("Replicate()");
  }
  bool operator==(const Placement& o) const { return dim_ == o.dim_; }
  bool operator!=(const Placement& o) const { return dim_ != o.dim_; }

 private:
  explicit Placement(int64_t dim) : dim_(dim) {}
  int64_t dim_;
};

}  // namespace fsdpp

#pragma once
// Process groups: who talks to whom. A ProcessGroup is a cheap, copyable handle.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fsdpp {

namespace detail {
struct ProcessGroupImpl;
}

// Options of init_process_group, spelled like PyTorch's arguments (libtorch's TORCH_ARG style:
// `name(v)` sets and returns *this, `name()` reads).
struct InitProcessGroupOptions {
  // "gloo"; "nccl" or "cpu:gloo,cuda:nccl" (CUDA tensors over NCCL, needs a CUDA-enabled
  // libtorch); "cpu:gloo,cuda:gloo" (docs/api.md, "Process groups").
  TORCH_ARG(std::string, backend) = "gloo";
  // "env://" (default: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them),
  // "tcp://host:port" or "file:///path/to/file".
  TORCH_ARG(std::string, init_method) = "env://";
  // -1: from the environment (RANK, WORLD_SIZE).
  TORCH_ARG(int, rank) = -1;
  TORCH_ARG(int, world_size) = -1;
  // An explicit rendezvous store (then rank and world_size are required).
  TORCH_ARG(c10::intrusive_ptr<c10d::Store>, store);
  // Applies to the rendezvous and to every collective.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  // Before each collective, ranks compare what they are about to do (kind, dtype,
  // sizes, root) and throw a clear error on a mismatch instead of hanging.
  // Costs one small exchange per collective. Unset: on, unless FSDPP_CHECK_COLLECTIVES=0.
  TORCH_ARG(std::optional<bool>, check_collectives);
};

class ProcessGroup {
 public:
  // An empty handle; collectives given one use the default (world) group.
  ProcessGroup() = default;

  // This process's rank in the group, or -1 when it is not a member (as PyTorch's get_rank(group)).
  int rank() const;
  int size() const;
  bool is_member() const;
  // The global (world) ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;
  // Group rank of a global rank; throws if that rank is not a member.
  int group_rank(int global_rank) const;
  int global_rank(int group_rank) const;
  std::chrono::milliseconds timeout() const;
  bool check_collectives() const;
  // "world" or "world/0/2" etc: how the group was derived, for error messages.
  const std::string& name() const;

  // A sub-group of this group's members (global ranks). Every member of this group must
  // call new_group with the same arguments in the same order (PyTorch requires the same of
  // all ranks); members not listed get a handle with is_member() == false.
  ProcessGroup new_group(const std::vector<int>& ranks) const;

  // The c10d process group underneath (null for a non-member).
  c10::intrusive_ptr<c10d::ProcessGroup> backend() const;

  bool defined() const { return impl_ != nullptr; }
  const detail::ProcessGroupImpl& impl() const;

  explicit ProcessGroup(std::shared_ptr<detail::ProcessGroupImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::ProcessGroupImpl> impl_;
};

// Joins the world as torchrun's environment (or the options) describe, sets it as the default
// group and returns it.
ProcessGroup init_process_group(const InitProcessGroupOptions& options = {});
// The default group set by init_process_group; throws if there is none.
ProcessGroup default_group();
bool is_initialized();
// Forgets the default group (its connections close when the last handle goes).
void destroy_process_group();

// torchrun's per-node variables, as read by init_process_group (0 and 1 when unset).
int get_local_rank();
int get_local_world_size();

}  // namespace fsdpp

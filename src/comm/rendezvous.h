#pragma once
// Where the ranks of a job meet (PyTorch's rendezvous: env://, tcp://, file:// or a given store)
// and the store-based barrier every group's members pass on it, so a rank that never arrives is
// named rather than waited for. Private to fsdpp.
#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fsdpp/process_group.h>

namespace fsdpp::detail {

struct ProcessGroupImpl;

struct Rendezvous {
  int rank = -1;
  int world_size = -1;
  c10::intrusive_ptr<c10d::Store> store;
  bool local_only = true;
  std::string master_host;  // of a TCP rendezvous: where the other nodes are reached from
  std::string description;  // where the ranks meet, for error messages
};

// The options' rank, world size and store or init_method (env:// under srun reads Slurm's
// variables first); the store's operations time out after `timeout`. Throws fsdpp::Error naming
// what is missing or malformed, or where the rendezvous failed.
Rendezvous rendezvous(const InitProcessGroupOptions& options, std::chrono::milliseconds timeout);

// The fake backend meets nobody: the rank and world size it plays, and a store of its own
// (PyTorch's FakeStore) unless one is given.
Rendezvous fake_rendezvous(const InitProcessGroupOptions& options);

// Every member of `g` checks in on `store` under `stage` and waits, within `timeout`, for the
// others, so a rank that never arrives is named (Gloo's own rendezvous would wait its fixed
// 5 minutes).
void wait_for_members(const ProcessGroupImpl& g, const c10::intrusive_ptr<c10d::Store>& store,
                      const std::string& stage, std::chrono::milliseconds timeout);

}  // namespace fsdpp::detail

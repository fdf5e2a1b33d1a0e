#pragma once
// What a ProcessGroup handle points to. Private to fsdpp.
#include <array>
#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fsdpp/process_group.h>

#include "comm/comm_thread.h"
#include "comm/device_stream.h"
#include "compat/c10d_backend.h"

namespace fsdpp::detail {

struct FlattenedMesh;
class ShmTransport;

struct ProcessGroupImpl {
  ProcessGroupImpl() = default;
  ProcessGroupImpl(const ProcessGroupImpl&) = delete;
  ProcessGroupImpl& operator=(const ProcessGroupImpl&) = delete;
  // Drains the comm thread, then shuts an NCCL backend down.
  ~ProcessGroupImpl();

  std::string name;                           // "world", "world/0", ...
  std::string backend_name;                   // as given: "gloo", "nccl", "cpu:gloo,cuda:nccl", "fake"
  bool fake = false;  // backend "fake": collectives run, exchange nothing (comm/fake_backend.h)
  c10::intrusive_ptr<c10d::Store> store;      // the world's store, unprefixed
  c10::intrusive_ptr<compat::C10dBackend> backend;  // null when not a member
  // What carries CUDA tensors (comm/device_transport.h): `backend` itself under "gloo",
  // ProcessGroupNCCL under "nccl", the NCCL-contract double (which takes CPU tensors too) under
  // "nccl-contract"; null when not a member.
  c10::intrusive_ptr<compat::C10dBackend> device_backend;
  // NCCL's contract (ProcessGroupNCCL or its double): collectives launched from the issuing
  // thread on its streams (comm/device_handoff.h), NCCL's dtype rules.
  bool device_launches_on_issue = false;
  // The NCCL-contract double: CPU tensors take the device path, on CPU comm streams.
  bool cpu_tensors_on_device_path = false;
  // TORCH_NCCL_BLOCKING_WAIT=1 when the group was made: the host waits for each device
  // collective's end, up to `timeout`.
  bool blocking_wait = false;
  c10::intrusive_ptr<c10d::ProcessGroup> c10d_group;  // what ProcessGroup::backend() hands out
  std::vector<int> ranks;                     // global ranks of the members
  int global_rank = -1;                       // this process in the world
  int rank = -1;                              // this process in the group, -1 if not a member
  std::chrono::milliseconds timeout{0};
  bool check_collectives = true;
  mutable std::atomic<int> next_child{0};     // numbers new_group() calls, for store prefixes
  mutable std::atomic<int64_t> next_seq{0};   // numbers collectives, for error messages
  // Set by the first collective of this group that fails: only that one asks the store who
  // was missing; the rest of a broken group's queue fails at once.
  mutable std::atomic<bool> failed{false};
  // The failure of a cross-rank check that ran beside a collective launched on the issuing thread
  // (NCCL's contract: the launch does not wait for it); the group's next collective throws it.
  mutable std::mutex check_failure_mutex;
  mutable std::exception_ptr check_failure;
  // Reusable bytes for collectives that need temporaries; only the comm thread touches it.
  mutable at::Tensor scratch_bytes;
  at::Tensor scratch(int64_t bytes) const {
    if (!scratch_bytes.defined() || scratch_bytes.numel() < bytes) scratch_bytes = at::empty({bytes}, at::kByte);
    return scratch_bytes.narrow(0, 0, bytes);
  }

  // The streams device collectives run on when their caller names none (comm/device_handoff.cpp:
  // all-gathers, reduce-scatters, the rest), each made at its first one.
  mutable std::array<CommStream, 3> device_streams;

  // The same-host transport (shm_transport.h), decided at the group's first exchange that can
  // use it; only the comm thread touches these. This and the scratch are declared before
  // comm_thread, so they outlive the collectives that thread still runs at destruction.
  mutable bool shm_decided = false;
  mutable std::shared_ptr<ShmTransport> shm;
  // Runs this group's collectives in issue order, so the order is the same on every rank
  // whether a collective is synchronous or not. Null when not a member.
  std::unique_ptr<CommThread> comm_thread;

  // Subgroups made from this group, by k: they live and die with it.
  mutable std::mutex subgroups_mutex;
  mutable std::map<int, ProcessGroup> consecutive_subgroups, strided_subgroups;
  // Groups made by members_group, by their (sorted) global ranks.
  mutable std::map<std::vector<int>, ProcessGroup> member_groups;
  // Meshes made by flattened_mesh with this group outer, by the inner group's ranks.
  mutable std::mutex meshes_mutex;
  mutable std::map<std::vector<int>, std::shared_ptr<const FlattenedMesh>> flattened_meshes;

  int size() const { return static_cast<int>(ranks.size()); }
  // "group world (rank 1 of 4)"
  std::string where() const;
};

// Resolves an empty handle to the default group and checks membership.
const ProcessGroupImpl& member_group(const class fsdpp::ProcessGroup& group, const char* collective);

// This rank's subgroup of k consecutive group ranks (ranks [0, k), [k, 2k), ... of `group`).
// Collective over `group` the first time for a given k (every member makes all of them, in
// the same order); cached on the group after.
ProcessGroup consecutive_subgroup(const ProcessGroup& group, int k);
// This rank's subgroup of the group ranks congruent modulo k (ranks {j, j + k, j + 2k, ...}): the
// members with the same place in every consecutive_subgroup(group, k) (HSDP's replicate groups).
// Collective and cached as consecutive_subgroup.
ProcessGroup strided_subgroup(const ProcessGroup& group, int k);
// The group of exactly `ranks` (global ranks, members of `group`; this rank among them), made by
// its members alone (PyTorch's new_group(..., use_local_synchronization=True)): only the listed
// ranks call it, the other members of `group` need not. Collective over `ranks` the first time
// for a given set; cached on `group` after, so one set of ranks has one group (and one store
// prefix, named after the ranks) per process.
ProcessGroup members_group(const ProcessGroup& group, std::vector<int> ranks);

}  // namespace fsdpp::detail

#pragma once
// Join: training with uneven inputs (PyTorch's torch.distributed.algorithms.join).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

#include <fsdpp/process_group.h>

namespace fsdpp {

// Inside Join::run(body), a rank that runs out of inputs leaves `body` and "joins": it then
// shadows the collectives of the ranks still training (through each joinable's JoinHook) until
// every rank has joined. Each iteration of a rank still training must call
// Join::notify_join_context(first joinable) once, before its other collectives; only the first
// joinable's notification communicates (one all_reduce of one element), the others are no-ops.
// ZeroRedundancyOptimizer::step() and DistributedDataParallel's forward notify by themselves.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Runs once per iteration that some rank still trains, on each joined rank, in the order of
  // the joinables: it must issue the collectives that one training iteration issues.
  virtual void main_hook() {}
  // Runs once on every rank after all ranks joined; is_last_joiner says whether this rank
  // was among the last to join.
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook() = 0;
  virtual ProcessGroup join_process_group() const = 0;
  virtual c10::Device join_device() const { return c10::Device(c10::kCPU); }
};

class Join {
 public:
  // All joinables must use the same process group. With enable = false, run() just runs the
  // body (as PyTorch's `enable` argument). With throw_on_early_termination, every rank throws
  // fsdpp::Error as soon as one rank has joined: the ranks still training from
  // notify_join_context, the joined rank from run() (PyTorch's argument of that name).
  explicit Join(std::vector<Joinable*> joinables, bool enable = true, bool throw_on_early_termination = false);

  // Runs `body` (this rank's training loop), then the join loop. An exception from `body`
  // propagates without running the join loop (peers then fail on their collective timeout).
  // Join contexts do not nest.
  void run(const std::function<void()>& body);

  // Tells the active Join context (if any) that this rank has not joined yet. Communicates
  // only when `joinable` is the first joinable of the context and this rank has not joined,
  // and then returns how many ranks of the group have not joined (this one included);
  // otherwise returns 0.
  static int64_t notify_join_context(Joinable& joinable);

 private:
  std::vector<Joinable*> joinables_;
  bool enable_;
  bool throw_on_early_termination_;
};

}  // namespace fsdpp

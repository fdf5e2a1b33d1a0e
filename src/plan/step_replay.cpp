#include "plan/step_replay.h"

#include <algorithm>
#include <deque>
#include <utility>

#include "fsdp/prefetch_within_bound.h"
#include "plan/memory_timeline.h"

namespace fsdpp::plan::detail {
namespace {

// torch::get_rng_state() of the CPU generator (mt19937's state and the normal-sampling cache).
constexpr int64_t kCpuRngStateBytes = 5056;

class StepReplay {
 public:
  // `prefetch_allowed`: kBounded's decision by unit; empty: measure the windows (no prefetch).
  StepReplay(const Tape& tape, const std::vector<UnitBytes>& units, const ReplayOptions& options,
             std::vector<bool> prefetch_allowed = {})
      : ops_(tape.ops()), tensors_(tape.tensors()), units_(units), options_(options),
        prefetch_allowed_(std::move(prefetch_allowed)) {
    const size_t n_units = units_.size();
    first_op_.assign(n_units, -1);
    last_op_.assign(n_units, -1);
    gathered_.assign(n_units, false);
    prefetched_.assign(n_units, false);
    gather_queued_.assign(n_units, false);
    backward_started_.assign(n_units, false);
    backward_done_.assign(n_units, false);
    windows_.peak.assign(n_units, -1);
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const int u = ops_[i].unit;
      if (u < 0) continue;
      if (first_op_[u] < 0) first_op_[u] = i;
      last_op_[u] = i;
    }
    const size_t n_tensors = tensors_.size();
    last_use_.assign(n_tensors, -1);
    last_saver_.assign(n_tensors, static_cast<int>(ops_.size()));
    kept_.assign(n_tensors, false);
    held_by_recompute_.assign(n_tensors, false);
    alive_.assign(n_tensors, false);
    kind_.assign(n_tensors, Bytes::kTemporaries);
    grad_alive_.assign(n_tensors, false);
    grad_owned_.assign(n_tensors, 0);
    extra_alive_.assign(ops_.size(), false);
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      for (int t : ops_[i].inputs) last_use_[t] = std::max(last_use_[t], i);
      for (int t : ops_[i].saves) {
        last_saver_[t] = std::min(last_saver_[t], i);
        // A checkpointed block keeps only what crosses its boundary (its inputs).
        if (!checkpointed(ops_[i].unit) || ops_[tensors_[t].producer].unit != ops_[i].unit) kept_[t] = true;
      }
      // The checkpoint's recompute closure (in the autograd graph until backward ends) holds
      // the arguments of a checkpointed block's forward.
      if (checkpointed(ops_[i].unit))
        for (int t : ops_[i].inputs)
          if (ops_[tensors_[t].producer].unit != ops_[i].unit) held_by_recompute_[t] = true;
    }
    released_at_.assign(ops_.size(), {});
    for (size_t t = 0; t < n_tensors; ++t)
      if (tensors_[t].hold_until >= 0) released_at_[tensors_[t].hold_until].push_back(static_cast<int>(t));
    kept_[ops_.back().output] = true;  // the loss, held by the caller through backward
  }

  // kBounded's decision from the windows this replay measured, by the engine's rule.
  std::vector<bool> within_bound_decision() const {
    std::vector<fsdpp::detail::PrefetchUnit> units;
    for (int u = 0; u < static_cast<int>(units_.size()); ++u)
      units.push_back({units_[u].gathered, units_[u].reduce_input, options_.shard_group_size, backward_prefetch_target(u)});
    return fsdpp::detail::decide_prefetch_within_bound(windows_, units);
  }

  ReplayResult run() {
    forward();
    ReplayResult& r = result_;
    r.forward_peak = timeline_.peak();
    r.forward_peak_in_flight = timeline_.peak_with_transient();
    r.after_forward = timeline_.live();
    r.activations = timeline_.of(Bytes::kActivations);
    backward();
    r.backward_peak = timeline_.peak();
    r.backward_peak_in_flight = timeline_.peak_with_transient();
    r.at_peak_params = timeline_.at_peak(Bytes::kGatheredParams);
    r.at_peak_grads = timeline_.at_peak(Bytes::kUnitGrads);
    r.at_peak_comm = timeline_.at_peak(Bytes::kCommBuffers);
    r.at_peak_activations = timeline_.at_peak(Bytes::kActivations);
    r.at_peak_temporaries = timeline_.at_peak(Bytes::kTemporaries);
    return std::move(r);
  }

 private:
  void note(const std::string& event) {
    if (!options_.trace) return;
    // An op's own momentary peak (allocated, then freed within it) shows as a new peak.
    const bool new_peak = timeline_.peak() > traced_peak_;
    traced_peak_ = timeline_.peak();
    result_.trace.emplace_back(new_peak ? event + " (peak so far " + std::to_string(traced_peak_) + " bytes)" : event,
                               timeline_.live());
  }
  std::string unit_name(int u) const { return u == 0 ? "root" : "block " + std::to_string(u - 1); }

  bool checkpointed(int unit) const { return options_.activation_checkpointing && unit >= 1; }
  int n_blocks() const { return static_cast<int>(units_.size()) - 1; }

  void forward() {
    int64_t grad_shards = 0;
    for (const auto& u : units_) grad_shards += u.grad_shard;
    timeline_.free(Bytes::kGradShards, grad_shards);  // libtorch's zero_grad() drops them
    for (int i = 0; i < static_cast<int>(ops_.size()); ++i) {
      const int u = ops_[i].unit;
      if (u >= 0 && i == first_op_[u]) pre_forward(u);
      run_forward_op(i, /*keep=*/[&](int t) { return kept_[t]; }, !checkpointed(u), /*recomputing=*/false);
      free_after_forward_op(i, 0, static_cast<int>(ops_.size()));
      note("forward " + ops_[i].name);
      if (u >= 0 && i == last_op_[u]) post_forward(u);
    }
  }

  template <typename Keep>
  void run_forward_op(int i, Keep keep, bool saving, bool recomputing) {
    const TapeOp& op = ops_[i];
    const int t = op.output;
    if (recomputing && i == last_op_[op.unit]) {
      // A recomputed block's output, the root of the checkpoint's inner backward, alive until
      // that ends (the unit's post-backward); the original's own life is unchanged.
      timeline_.alloc(Bytes::kTemporaries, tensors_[t].bytes);
      checkpoint_backward_temps_[op.unit] += tensors_[t].bytes;
    } else {
      kind_[t] = keep(t) ? Bytes::kActivations : Bytes::kTemporaries;
      alloc_tensor(t);
    }
    if (op.forward_temp > 0) {
      timeline_.alloc(Bytes::kTemporaries, op.forward_temp);
      timeline_.free(Bytes::kTemporaries, op.forward_temp);
    }
    if (op.saved_extra > 0) {
      timeline_.alloc(saving ? Bytes::kActivations : Bytes::kTemporaries, op.saved_extra);
      if (saving)
        extra_alive_[i] = true;
      else
        timeline_.free(Bytes::kTemporaries, op.saved_extra);
    }
  }

  // Tensors made in ops [begin, end) whose last forward use (or holding local) is op i.
  void free_after_forward_op(int i, int begin, int end) {
    auto consider = [&](int t) {
      if (!alive_[t] || kind_[t] == Bytes::kActivations) return;
      const TapeTensor& tensor = tensors_[t];
      if (tensor.producer < begin || tensor.producer >= end) return;
      int last = std::max({last_use_[t], tensor.hold_until, tensor.producer});
      if (end < static_cast<int>(ops_.size())) last = std::min(last, end - 1);  // a recompute ends with its unit
      if (last == i) free_tensor(t);
    };
    consider(ops_[i].output);
    for (int t : ops_[i].inputs) consider(t);
    for (int t : released_at_[i]) consider(t);
  }

  void alloc_tensor(int t) {
    timeline_.alloc(kind_[t], tensors_[t].bytes);
    alive_[t] = true;
  }
  void free_tensor(int t) {
    if (!alive_[t]) return;
    timeline_.free(kind_[t], tensors_[t].bytes);
    alive_[t] = false;
  }

  void gather(int u, Bytes kind) {
    timeline_.alloc(Bytes::kTemporaries, units_[u].gather_input);  // on the issuing thread
    gathered_[u] = true;
    prefetched_[u] = kind == Bytes::kCommBuffers;
    if (late() && prefetched_[u]) {
      queue_.push_back({false, u});
      gather_queued_[u] = true;
      update_transient();
      return;
    }
    if (late()) run_comm_queue(-1);  // waited for at once: what was issued before it runs first
    end_reduce_staging();  // the comm thread runs collectives in order
    timeline_.alloc(kind, units_[u].gathered);
    timeline_.free(Bytes::kTemporaries, units_[u].gather_input);
  }
  void wait_for_gather(int u) {
    if (!gathered_[u]) gather(u, Bytes::kGatheredParams);
    if (gather_queued_[u]) run_comm_queue(u);
    if (prefetched_[u]) timeline_.move(Bytes::kCommBuffers, Bytes::kGatheredParams, units_[u].gathered);
    prefetched_[u] = false;
  }
  void reshard(int u) {
    if (!gathered_[u]) return;
    timeline_.free(Bytes::kGatheredParams, units_[u].gathered);
    gathered_[u] = false;
  }

  void pre_forward(int u) {
    // A checkpointed block keeps the CPU generator's state for its recompute.
    if (checkpointed(u)) timeline_.alloc(Bytes::kActivations, kCpuRngStateBytes);
    wait_for_gather(u);
    // forward order: root, block 0, ..., the last block (which prefetches nothing)
    const int next = u + 1;
    if (next <= n_blocks() && !gathered_[next]) gather(next, Bytes::kCommBuffers);
    note("pre-forward " + unit_name(u));
  }
  void post_forward(int u) {
    if (u != 0 && options_.reshard_after_forward) reshard(u);
    if (u == 0) windows_.live_after_forward = timeline_.live();
    note("post-forward " + unit_name(u));
  }

  void pre_backward(int u) {
    backward_started_[u] = true;
    close_window();
    wait_for_gather(u);
    if (measuring()) {
      if (windows_.order.empty()) grad_shards_at_start_ = timeline_.of(Bytes::kGradShards);
      timeline_.mark();
      measuring_ = u;
      windows_.order.push_back(u);
    }
    note("pre-backward " + unit_name(u));
    prefetch_for_backward(u);
    end_reduce_staging();  // the unit's backward computes next
  }

  // post-forward order is block 0, ..., the last block, root: each prefetches the one before
  int backward_prefetch_target(int u) const {
    const int target = u == 0 ? n_blocks() : u - 1;
    return target < 1 ? -1 : target;
  }
  void prefetch_for_backward(int u) {
    const int target = backward_prefetch_target(u);
    if (target < 0 || gathered_[target] || backward_done_[target]) return;
    switch (options_.backward_prefetch) {
      case BackwardPrefetch::kNone:
        return;
      case BackwardPrefetch::kBounded:
        if (measuring() || !prefetch_allowed_[u]) return;
        break;
      case BackwardPrefetch::kBackwardPre:
        break;
    }
    gather(target, Bytes::kCommBuffers);
    note("pre-backward " + unit_name(u) + ", prefetched " + unit_name(target));
  }

  // The slow order's comm thread: collectives issued and not yet run, in issue order.
  bool late() const { return options_.comm_thread_late; }
  struct Queued {
    bool reduce;
    int unit;
  };
  // Runs the queue up to and including unit `through`'s gather (-1: all of it).
  void run_comm_queue(int through) {
    while (!queue_.empty())
      if (run_next_collective() == through) return;
  }
  // The comm thread may run any prefix of its queue before the compute thread's next allocation:
  // the most that adds is in the middle of a gather, its output allocated and its input (a cast
  // copy of the shard) not yet freed (N = 1 in bfloat16: block 1's gather copied during block
  // 2's backward, 0.37 MiB over the slow order's peak). A reduce-scatter run frees its input.
  void update_transient() {
    int64_t ran = 0, most = 0;
    for (const Queued& q : queue_) {
      const UnitBytes& b = units_[q.unit];
      if (q.reduce) {
        ran -= b.reduce_staging + b.reduce_input;
        continue;
      }
      most = std::max(most, ran + b.gathered);
      ran += b.gathered - b.gather_input;
    }
    timeline_.set_transient(most);
  }
  // Returns the unit of the gather it ran, -1 after a reduce-scatter.
  int run_next_collective() {
    const Queued q = queue_.front();
    queue_.pop_front();
    update_transient();
    const UnitBytes& b = units_[q.unit];
    if (q.reduce) {
      timeline_.free(Bytes::kCommBuffers, b.reduce_staging + b.reduce_input);
      reduced_.push_back(q.unit);
      return -1;
    }
    timeline_.alloc(Bytes::kCommBuffers, b.gathered);
    timeline_.free(Bytes::kTemporaries, b.gather_input);
    gather_queued_[q.unit] = false;
    return q.unit;
  }

  // The last reduce-scatter's input and the comm thread's temporaries: taken as alive from its
  // issue until the comm thread starts the next collective or the next unit's backward
  // computes, whichever comes first.
  void end_reduce_staging() {
    timeline_.free(Bytes::kCommBuffers, reduce_in_flight_);
    reduce_in_flight_ = 0;
  }

  void finalize_reduce_scatter() {
    // The slow order: what the comm thread has run (the engine finalizes finished ones only).
    for (int u : reduced_) {
      timeline_.alloc(Bytes::kGradShards, units_[u].grad_shard);
      timeline_.free(Bytes::kCommBuffers, units_[u].reduce_output);
    }
    reduced_.clear();
    end_reduce_staging();
    if (pending_ < 0) return;
    timeline_.alloc(Bytes::kGradShards, units_[pending_].grad_shard);
    timeline_.free(Bytes::kCommBuffers, units_[pending_].reduce_output);
    pending_ = -1;
  }
  void post_backward(int u) {
    backward_done_[u] = true;
    // The checkpoint's backward has returned; its graph node (the forward's generator state and
    // arguments) lives on until the whole backward ends.
    timeline_.free(Bytes::kTemporaries, checkpoint_backward_temps_[u]);
    checkpoint_backward_temps_[u] = 0;
    finalize_reduce_scatter();
    reshard(u);
    timeline_.alloc(Bytes::kCommBuffers, units_[u].reduce_input);  // packing frees the gradients after
    timeline_.free(Bytes::kUnitGrads, unit_grads_[u]);
    unit_grads_[u] = 0;
    timeline_.alloc(Bytes::kCommBuffers, units_[u].reduce_output);
    // On the comm thread: the input is freed once exchanged, with the staging.
    timeline_.alloc(Bytes::kCommBuffers, units_[u].reduce_staging);
    if (late()) {
      queue_.push_back({true, u});
      note("post-backward " + unit_name(u));
      return;
    }
    reduce_in_flight_ = units_[u].reduce_staging + units_[u].reduce_input;
    pending_ = u;
    // A group of one only copies: done by the post-backward's closing finalize.
    if (options_.shard_group_size == 1) finalize_reduce_scatter();
    note("post-backward " + unit_name(u));
  }

  // A checkpointed block's forward again, saving this time, inside its backward.
  void recompute(int u) {
    // The caller's CPU generator state, put back when the checkpoint's backward returns.
    timeline_.alloc(Bytes::kTemporaries, kCpuRngStateBytes);
    checkpoint_backward_temps_[u] += kCpuRngStateBytes;
    for (int i = first_op_[u]; i <= last_op_[u]; ++i) {
      run_forward_op(i, [&](int t) { return last_saver_[t] < static_cast<int>(ops_.size()) &&
                                            ops_[last_saver_[t]].unit == u; }, true, /*recomputing=*/true);
      free_after_forward_op(i, first_op_[u], last_op_[u] + 1);
      note("recompute " + ops_[i].name);
    }
  }

  void run_backward_op(int i) {
    const TapeOp& op = ops_[i];
    std::vector<int> inputs = op.inputs;
    std::sort(inputs.begin(), inputs.end());
    inputs.erase(std::unique(inputs.begin(), inputs.end()), inputs.end());
    const int out = op.output;
    for (int t : inputs) {
      if (!tensors_[t].requires_grad) continue;
      const int64_t bytes = tensors_[t].bytes;
      const bool alias = op.grad_passes_through && bytes == tensors_[out].bytes && grad_alive_[out];
      if (!grad_alive_[t]) {
        // The output's gradient itself (an addition), or a new tensor.
        if (!alias) timeline_.alloc(Bytes::kTemporaries, bytes);
        grad_owned_[t] = alias ? 0 : bytes;
        grad_alive_[t] = true;
      } else if (grad_owned_[t] == 0) {
        // Added to a gradient it shares with another tensor: the sum is a new tensor.
        timeline_.alloc(Bytes::kTemporaries, bytes);
        grad_owned_[t] = bytes;
      } else if (!alias) {
        // Made, then added in place into the gradient already there.
        timeline_.alloc(Bytes::kTemporaries, bytes);
        timeline_.free(Bytes::kTemporaries, bytes);
      }
    }
    if (op.param_grad_bytes > 0) {
      if (op.param_grad_accumulates) {
        timeline_.alloc(Bytes::kTemporaries, op.param_grad_bytes);
        timeline_.free(Bytes::kTemporaries, op.param_grad_bytes);
      } else {
        timeline_.alloc(Bytes::kUnitGrads, op.param_grad_bytes);
        unit_grads_[op.unit] += op.param_grad_bytes;
      }
    }
    if (grad_alive_[out]) {
      // Handed on by an addition to an input that does not own it: that input owns it now.
      int64_t owned = grad_owned_[out];
      if (op.grad_passes_through)
        for (int t : inputs)
          if (owned > 0 && tensors_[t].requires_grad && grad_owned_[t] == 0 && tensors_[t].bytes == tensors_[out].bytes) {
            grad_owned_[t] = owned;
            owned = 0;
          }
      timeline_.free(Bytes::kTemporaries, owned);
      grad_alive_[out] = false;
      grad_owned_[out] = 0;
    }
    for (int t : op.saves)
      if (last_saver_[t] == i && !held_by_recompute_[t]) free_tensor(t);
    if (extra_alive_[i]) {
      timeline_.free(Bytes::kActivations, op.saved_extra);
      extra_alive_[i] = false;
    }
  }

  void backward() {
    unit_grads_.assign(units_.size(), 0);
    checkpoint_backward_temps_.assign(units_.size(), 0);
    for (int i = static_cast<int>(ops_.size()) - 1; i >= 0; --i) {
      const int u = ops_[i].unit;
      if (u >= 0 && !backward_started_[u]) {
        pre_backward(u);
        if (checkpointed(u)) recompute(u);
      }
      run_backward_op(i);
      note("backward " + ops_[i].name);
      if (u >= 1 && i == first_op_[u]) post_backward(u);
    }
    // The final callback: the root's post-backward (its inputs are token ids), then every finalize.
    post_backward(0);
    if (late())
      while (!queue_.empty()) {  // each finalize waits for its reduce-scatter
        run_next_collective();
        finalize_reduce_scatter();
      }
    finalize_reduce_scatter();
    close_window();
  }

  // kBounded's first replay, as the engine's first backward: a unit's window runs from its
  // gather's wait at pre-backward to the next unit's pre-backward (the last to the end of
  // backward), less the gradient shards made meanwhile.
  bool measuring() const { return options_.backward_prefetch == BackwardPrefetch::kBounded && prefetch_allowed_.empty(); }
  void close_window() {
    if (measuring_ < 0) return;
    windows_.peak[measuring_] =
        timeline_.peak_since_mark() - (timeline_.of(Bytes::kGradShards) - grad_shards_at_start_);
    measuring_ = -1;
  }

  const std::vector<TapeOp>& ops_;
  const std::vector<TapeTensor>& tensors_;
  const std::vector<UnitBytes>& units_;
  ReplayOptions options_;
  std::vector<bool> prefetch_allowed_;
  // What the first backward measures, in the replay's bytes (above the held state: the engine's
  // absolute bytes less a constant, which the rule's comparisons ignore).
  fsdpp::detail::BackwardWindows windows_;
  int measuring_ = -1;
  int64_t grad_shards_at_start_ = 0;
  MemoryTimeline timeline_;
  std::vector<int> first_op_, last_op_, last_use_, last_saver_;
  std::deque<Queued> queue_;
  std::vector<int> reduced_;  // reduce-scatters the slow order's comm thread ran, not yet finalized
  std::vector<bool> gathered_, prefetched_, gather_queued_, backward_started_, backward_done_, kept_, alive_, grad_alive_, extra_alive_,
      held_by_recompute_;
  std::vector<Bytes> kind_;
  std::vector<std::vector<int>> released_at_;  // tensors a C++ local holds until op i
  // grad_owned_: bytes of the gradient tensor a tensor's grad owns; checkpoint_backward_temps_: what
  // a checkpointed unit's backward holds until it returns (recomputed output, caller's RNG state)
  std::vector<int64_t> unit_grads_, grad_owned_, checkpoint_backward_temps_;
  int pending_ = -1;
  int64_t reduce_in_flight_ = 0;
  int64_t traced_peak_ = 0;
  ReplayResult result_;
};

}  // namespace

ReplayResult replay_step(const Tape& tape, const std::vector<UnitBytes>& units, const ReplayOptions& options) {
  std::vector<bool> allowed;
  if (options.backward_prefetch == BackwardPrefetch::kBounded) {
    // Measured in the benign order (the decision is taken once, from the first backward).
    ReplayOptions first = options;
    first.trace = false;
    first.comm_thread_late = false;
    StepReplay measured(tape, units, first);
    measured.run();
    allowed = measured.within_bound_decision();
  }
  ReplayOptions benign = options, slow = options;
  benign.comm_thread_late = false;
  slow.comm_thread_late = true;
  ReplayResult r = StepReplay(tape, units, benign, allowed).run();
  ReplayResult late = StepReplay(tape, units, slow, allowed).run();
  r.forward_peak_late = late.forward_peak;
  r.backward_peak_late = late.backward_peak;
  r.forward_peak_in_flight = late.forward_peak_in_flight;
  r.backward_peak_in_flight = late.backward_peak_in_flight;
  for (auto& [event, live] : late.trace) r.trace.emplace_back("slow order: " + event, live);
  r.prefetched_within_bound = std::move(allowed);
  return r;
}

}  // namespace fsdpp::plan::detail

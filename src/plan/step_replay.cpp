#include "plan/step_replay.h"

#include <algorithm>

#include "plan/memory_timeline.h"

namespace fsdpp::plan::detail {
namespace {

// torch::get_rng_state() of the CPU generator (mt19937's state and the normal-sampling cache).
constexpr int64_t kCpuRngStateBytes = 5056;

class StepReplay {
 public:
  StepReplay(const Tape& tape, const std::vector<UnitBytes>& units, const ReplayOptions& options)
      : ops_(tape.ops()), tensors_(tape.tensors()), units_(units), options_(options) {
    const size_t n_units = units_.size();
    first_op_.assign(n_units, -1);
    last_op_.assign(n_units, -1);
    gathered_.assign(n_units, false);
    prefetched_.assign(n_units, false);
    backward_started_.assign(n_units, false);
    backward_done_.assign(n_units, false);
    for (const auto& u : units_) largest_ = std::max(largest_, u.gathered);
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
    }
    released_at_.assign(ops_.size(), {});
    for (size_t t = 0; t < n_tensors; ++t)
      if (tensors_[t].hold_until >= 0) released_at_[tensors_[t].hold_until].push_back(static_cast<int>(t));
    kept_[ops_.back().output] = true;  // the loss, held by the caller through backward
  }

  ReplayResult run() {
    forward();
    ReplayResult& r = result_;
    r.forward_peak = timeline_.peak();
    r.after_forward = timeline_.live();
    r.activations = timeline_.of(Bytes::kActivations);
    after_forward_ = timeline_.live();
    backward();
    r.backward_peak = timeline_.peak();
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
      run_forward_op(i, /*keep=*/[&](int t) { return kept_[t]; }, !checkpointed(u));
      free_after_forward_op(i, 0, static_cast<int>(ops_.size()));
      note("forward " + ops_[i].name);
      if (u >= 0 && i == last_op_[u]) post_forward(u);
    }
  }

  template <typename Keep>
  void run_forward_op(int i, Keep keep, bool saving) {
    const TapeOp& op = ops_[i];
    const int t = op.output;
    if (alive_[t]) {
      // A recomputed block's output: the original stays; the recomputed one is the root of the
      // checkpoint's inner backward, alive until that ends (the unit's post-backward).
      timeline_.alloc(Bytes::kTemporaries, tensors_[t].bytes);
      recomputed_output_[op.unit] += tensors_[t].bytes;
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
    timeline_.alloc(Bytes::kTemporaries, units_[u].gather_input);
    timeline_.alloc(kind, units_[u].gathered);
    timeline_.free(Bytes::kTemporaries, units_[u].gather_input);
    gathered_[u] = true;
    prefetched_[u] = kind == Bytes::kCommBuffers;
  }
  void wait_for_gather(int u) {
    if (!gathered_[u]) gather(u, Bytes::kGatheredParams);
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
    note("post-forward " + unit_name(u));
  }

  void pre_backward(int u) {
    backward_started_[u] = true;
    wait_for_gather(u);
    note("pre-backward " + unit_name(u));
    // post-forward order is block 0, ..., the last block, root: each prefetches the one before
    const int target = u == 0 ? n_blocks() : u - 1;
    if (target < 1 || gathered_[target] || backward_done_[target]) return;
    switch (options_.backward_prefetch) {
      case BackwardPrefetch::kNone:
        return;
      case BackwardPrefetch::kBounded:
        if (timeline_.live() + units_[u].grads + units_[target].gathered > after_forward_ + 2 * largest_) return;
        break;
      case BackwardPrefetch::kBackwardPre:
        break;
    }
    gather(target, Bytes::kCommBuffers);
    note("pre-backward " + unit_name(u) + ", prefetched " + unit_name(target));
  }

  void finalize_reduce_scatter() {
    if (pending_ < 0) return;
    timeline_.alloc(Bytes::kGradShards, units_[pending_].grad_shard);
    timeline_.free(Bytes::kCommBuffers, units_[pending_].reduce_output);
    pending_ = -1;
  }
  void post_backward(int u) {
    backward_done_[u] = true;
    timeline_.free(Bytes::kTemporaries, recomputed_output_[u]);
    recomputed_output_[u] = 0;
    if (checkpointed(u)) timeline_.free(Bytes::kActivations, kCpuRngStateBytes);
    finalize_reduce_scatter();
    reshard(u);
    timeline_.alloc(Bytes::kCommBuffers, units_[u].reduce_input);  // packing frees the gradients after
    timeline_.free(Bytes::kUnitGrads, unit_grads_[u]);
    unit_grads_[u] = 0;
    timeline_.alloc(Bytes::kCommBuffers, units_[u].reduce_output);
    timeline_.free(Bytes::kCommBuffers, units_[u].reduce_input);  // on the comm thread, once exchanged
    pending_ = u;
    // A group of one only copies: done by the post-backward's closing finalize.
    if (options_.reduce_done_at_issue) finalize_reduce_scatter();
    note("post-backward " + unit_name(u));
  }

  // A checkpointed block's forward again, saving this time, inside its backward.
  void recompute(int u) {
    for (int i = first_op_[u]; i <= last_op_[u]; ++i) {
      run_forward_op(i, [&](int t) { return last_saver_[t] < static_cast<int>(ops_.size()) &&
                                            ops_[last_saver_[t]].unit == u; }, true);
      free_after_forward_op(i, first_op_[u], last_op_[u] + 1);
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
      if (last_saver_[t] == i) free_tensor(t);
    if (extra_alive_[i]) {
      timeline_.free(Bytes::kActivations, op.saved_extra);
      extra_alive_[i] = false;
    }
  }

  void backward() {
    unit_grads_.assign(units_.size(), 0);
    recomputed_output_.assign(units_.size(), 0);
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
    finalize_reduce_scatter();
  }

  const std::vector<TapeOp>& ops_;
  const std::vector<TapeTensor>& tensors_;
  const std::vector<UnitBytes>& units_;
  ReplayOptions options_;
  MemoryTimeline timeline_;
  std::vector<int> first_op_, last_op_, last_use_, last_saver_;
  std::vector<bool> gathered_, prefetched_, backward_started_, backward_done_, kept_, alive_, grad_alive_, extra_alive_;
  std::vector<Bytes> kind_;
  std::vector<std::vector<int>> released_at_;  // tensors a C++ local holds until op i
  std::vector<int64_t> unit_grads_, grad_owned_, recomputed_output_;  // bytes of the gradient tensor a tensor's grad owns
  int64_t largest_ = 0, after_forward_ = 0;
  int pending_ = -1;
  int64_t traced_peak_ = 0;
  ReplayResult result_;
};

}  // namespace

ReplayResult replay_step(const Tape& tape, const std::vector<UnitBytes>& units, const ReplayOptions& options) {
  return StepReplay(tape, units, options).run();
}

}  // namespace fsdpp::plan::detail

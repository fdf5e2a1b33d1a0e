#pragma once
// The gradient reducer behind DistributedDataParallel: buckets, the backward hooks that fill
// them, the asynchronous reductions and the end-of-backward finalization. Private to fsdpp.
//
// One backward with synchronization on, in order:
//  1. A hook on the forward's outputs (prepare_for_backward), or else the first gradient hook
//     of the backward, resets the per-backward state and queues finalize_backward() with the
//     autograd engine (it runs when that backward ends: the outputs' hook runs in the
//     outermost backward, a gradient hook may run in one nested in it by a recomputation).
//  2. Each parameter's hook (after AccumulateGrad wrote `.grad`) copies the gradient into its
//     bucket slot; when a bucket's last gradient is in, it and every ready bucket after it
//     are launched, strictly in bucket order so that all ranks issue the same collectives.
//  3. After each hook, buckets whose reduction already completed are finished in order
//     (`.grad` written, bucket-reduced callbacks run).
//  4. finalize_backward: parameters that got no gradient are an error, or with
//     find_unused_parameters are marked ready (zeros, or their accumulated `.grad`); the
//     used-parameter map is all-reduced; every bucket is waited for and finished.
// With static_graph, the first synchronized backward only counts each parameter's hook calls
// and does steps 2-4 at its end; later ones mark a parameter ready at its counted call.
//
// Under Join (uneven inputs), while DDP's join hook lives: each forward of a rank still
// training announces whether its backward synchronizes (announce_forward), and a joined rank
// shadows each synchronized backward with run_joined_iteration: the same collectives in the
// same order, contributing zeros.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>

#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/join.h>

#include "compat/autograd_node.h"
#include "ddp/module_states.h"

namespace fsdpp::detail {

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  using NamedTensor = detail::NamedTensor;

  // `parameters`: the module's parameters that require grad, in registration order, each once.
  static std::shared_ptr<Reducer> create(std::vector<NamedTensor> parameters, ProcessGroup group,
                                         DistributedDataParallelOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const DistributedDataParallelOptions& options() const { return options_; }
  const ProcessGroup& group() const { return group_; }

  // Returns the previous value.
  bool set_sync_enabled(bool enabled);
  void register_comm_hook(CommHook hook);
  void register_bucket_reduced_callback(BucketReducedCallback callback);
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  size_t num_buckets() const { return buckets_.size(); }

  // Join. begin_join/end_join bracket the life of DDP's join hook; `joinable` is the DDP
  // object in the Join context (the one whose notification counts).
  void begin_join(Joinable* joinable, bool divide_by_initial_world_size);
  void end_join();
  Joinable* join_joinable() const;  // null outside a Join
  bool sync_enabled() const;
  // static_graph: the first synchronized backward has recorded the graph.
  bool graph_recorded() const;
  // Throws if a forward announced a synchronized backward that has not run yet.
  void check_no_backward_pending() const;
  // A forward of a rank still training announced whether its backward synchronizes;
  // `not_joined` ranks still train (0: unknown).
  void announce_forward(bool will_sync, int64_t not_joined);
  // A joined rank's shadow of one synchronized backward: every bucket reduced in bucket order
  // with zeros as this rank's contribution (through the comm hook if one is registered), the
  // used-parameter map with find_unused_parameters, then `.grad` written with the result and
  // the bucket-reduced callbacks run, as on the ranks still training.
  void run_joined_iteration();

 private:
  struct Param {
    std::string name;
    at::Tensor tensor;
    size_t bucket = 0;
    size_t slot = 0;  // position in the bucket
    compat::AutogradNodePtr accumulator;  // kept alive so our hook stays on it
    uintptr_t hook_key = 0;
  };
  struct Bucket {
    GradBucket grad_bucket;       // what hooks and callbacks see
    std::vector<size_t> params;   // indices into params_
    size_t pending = 0;           // gradients not yet in during this backward
    bool launched = false;
    bool finished = false;
    Work work;
  };
  class GradReadyHook;

  Reducer(std::vector<NamedTensor> parameters, ProcessGroup group, DistributedDataParallelOptions options);
  void build_buckets();
  void install_hooks();

  void on_gradient(size_t index);  // a parameter's AccumulateGrad post hook
  void on_output_gradient();       // a hook on a forward output: backward through it started
  void begin_backward();
  // static_graph: whether `index` is now ready (its hook count reached the recorded one).
  bool static_graph_ready(size_t index);
  void record_static_graph();
  void finalize_backward();
  // Sets globally_used_ from every rank's map (MAX).
  void reduce_used_map(const std::vector<char>& local);
  void end_backward();
  // Under Join: the backward now starting must match the forward's announcement.
  void check_join_announcement() const;
  void mark_ready(size_t index);
  void launch_ready_buckets();
  // Finishes launched buckets in order; without `wait`, only those already complete whose
  // parameters all got a gradient in this backward.
  void finish_buckets(bool wait);
  void finish_bucket(Bucket& bucket);
  // After an error: waits for launched reductions (ignoring their errors) and resets.
  void abort_backward() noexcept;
  void reset_backward_state();
  std::string where() const;

  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  ProcessGroup group_;
  DistributedDataParallelOptions options_;
  CommHook comm_hook_;
  std::vector<BucketReducedCallback> reduced_callbacks_;

  // Guards everything below; recursive because user hooks and callbacks run under it.
  mutable std::recursive_mutex mutex_;
  bool sync_enabled_ = true;
  bool in_backward_ = false;
  std::vector<char> ready_;             // this backward
  std::vector<char> got_gradient_;      // this backward: the hook fired
  std::vector<char> used_since_sync_;   // any backward since the last synchronized one
  std::vector<char> globally_used_;     // after the used-map all_reduce (all 1 without find_unused)
  std::vector<char> reachable_;         // from prepare_for_backward since the last synchronized backward
  bool have_reachability_ = false;
  std::vector<int> hook_calls_;         // this backward
  // static_graph: each parameter's hook calls in the first synchronized backward, and which
  // parameters some rank used then; empty until that backward ends.
  std::vector<int> recorded_hook_calls_;
  std::vector<char> recorded_globally_used_;
  size_t next_to_launch_ = 0;
  size_t next_to_finish_ = 0;

  // Join: see begin_join. join_announced_ is -1 when no forward announced since the last
  // synchronized backward, else whether that forward's backward synchronizes.
  Joinable* join_joinable_ = nullptr;
  bool join_divide_by_initial_world_size_ = true;
  int join_announced_ = -1;
  int64_t divisor_ = 0;  // what gradients are divided by without a comm hook; 0: the group's size
};

}  // namespace fsdpp::detail

#pragma once
// DistributedDataParallel (PyTorch's torch.nn.parallel.DistributedDataParallel) and
// replicate (FSDP2's composable spelling of the same thing).
//
//   auto model = MyNet();                           // the same architecture on every rank
//   fsdpp::DistributedDataParallel ddp(model, fsdpp::DistributedDataParallelOptions().bucket_cap_mb(25));
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   auto loss = loss_fn(ddp.forward(x), y);         // or model->forward(x): forward is the user's
//   loss.backward();                                // gradients are now averaged over the ranks
//   opt.step();
//
// Construction checks that every rank has the same parameters and buffers (names, shapes,
// dtypes) and broadcasts rank 0's values. Backward hooks copy each parameter's gradient into
// a flat bucket (parameters in reverse registration order, buckets up to bucket_cap_mb); a
// bucket's all_reduce starts asynchronously as soon as all its gradients are in, in bucket
// order, so communication overlaps the rest of backward. When backward ends, DDP waits for
// every bucket and writes the averaged gradients to `.grad`.
//
// Uneven inputs (PyTorch's `with ddp_model.join():`): DDP is a fsdpp::Joinable.
//
//   ddp.join([&] { for (auto& batch : my_batches) { loss_fn(ddp.forward(batch.x), batch.y).backward(); opt.step(); } });
//
// A rank that ran out of batches shadows each iteration of the ranks still training (their
// gradient all_reduces, with zeros), so those get the sum of their gradients divided by the
// group's size; at the end every rank gets the parameters of the last rank to finish.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/join.h>
#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

namespace fsdpp {

namespace detail {
class Reducer;
class DDPJoinHook;
}

struct DistributedDataParallelOptions {
  // The group whose ranks replicate the model; empty means the default group.
  TORCH_ARG(ProcessGroup, process_group);
  // Bucket capacity in MiB (fractions allowed). A parameter larger than the cap gets a bucket of its own.
  // As in PyTorch, the first bucket (the last layers) is capped at min(1 MiB, this) so that
  // communication starts early in backward.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  // Broadcast rank 0's buffers at the start of every forward made through the DDP object.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Allow parameters that get no gradient in a backward: they are reduced as zeros (and a
  // parameter no rank used keeps its `.grad` untouched). Costs one small all_reduce per step.
  TORCH_ARG(bool, find_unused_parameters) = false;
  // Make each `.grad` a view into its bucket: no copy in or out, and no second copy of the gradients.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // PyTorch's static_graph: the set of parameters that get gradients, and how many times each
  // parameter's gradient hook fires in a backward, stay the same for the whole training. The
  // first synchronized backward records them (its reductions all wait for the end of
  // backward); afterwards a parameter is reduced once its hook fired that many times (more
  // than once for a layer checkpointed twice), unused parameters need no search and no
  // per-step all_reduce, and a backward that differs from the first is an error naming the
  // parameter.
  TORCH_ARG(bool, static_graph) = false;
};

// The arguments of PyTorch's `DistributedDataParallel.join(...)`.
struct DistributedDataParallelJoinOptions {
  // true: the ranks still training get the sum of their gradients divided by the group's
  // size (the joined ranks contribute zeros). false: divided by the number of ranks still
  // training in that iteration (known only when DDP is the first joinable of the Join, else
  // the group's size is used). Applies to the default reduction; a comm hook decides itself.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
  // false: join() just runs the body.
  TORCH_ARG(bool, enable) = true;
  // Every rank throws fsdpp::Error as soon as one rank runs out of inputs.
  TORCH_ARG(bool, throw_on_early_termination) = false;
};

// One bucket of gradients, as a communication hook sees it (PyTorch's dist.GradBucket).
class GradBucket {
 public:
  // Position in the order buckets are reduced (0 holds the last-registered parameters).
  size_t index() const { return index_; }
  // The bucket's gradients back to back, flat and contiguous. A comm hook reduces it in place.
  const at::Tensor& buffer() const { return buffer_; }
  // Views into buffer(), one per parameter, shaped like it.
  const std::vector<at::Tensor>& gradients() const { return gradients_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  // The parameters' names in the module (as named_parameters() spells them).
  const std::vector<std::string>& parameter_names() const { return parameter_names_; }
  // Element offset of each parameter's gradient in buffer().
  const std::vector<int64_t>& offsets() const { return offsets_; }
  // True for the bucket reduced last in a backward.
  bool is_last() const { return is_last_; }
  const ProcessGroup& process_group() const { return process_group_; }

 private:
  friend class detail::Reducer;
  size_t index_ = 0;
  at::Tensor buffer_;
  std::vector<at::Tensor> gradients_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::string> parameter_names_;
  std::vector<int64_t> offsets_;
  bool is_last_ = false;
  ProcessGroup process_group_;
};

// Reduces one bucket: starts the communication and returns its Work. When the Work is
// complete, bucket.buffer() must hold the values to write to `.grad` (the default hook:
// all_reduce with ReduceOp::AVG, i.e. the sum divided by the group size).
using CommHook = std::function<Work(GradBucket& bucket)>;
// Runs after a bucket's reduction completed and its parameters' `.grad` hold the result.
using BucketReducedCallback = std::function<void(GradBucket& bucket)>;

template <typename ModuleImpl = torch::nn::Module>
class DistributedDataParallel;

// The untyped DDP: everything but a typed forward. Any DistributedDataParallel<M> is one, so
// a function that takes `DistributedDataParallel<>&` accepts them all.
template <>
class DistributedDataParallel<torch::nn::Module> : public Joinable {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, DistributedDataParallelOptions options = {});
  template <typename ModuleImpl>
  DistributedDataParallel(torch::nn::ModuleHolder<ModuleImpl> module, DistributedDataParallelOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(options)) {}

  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  const DistributedDataParallelOptions& options() const;
  const ProcessGroup& process_group() const;

  // Gradients of the backward passes run while the guard lives stay local and accumulate in
  // `.grad`; the first backward after it averages the accumulated gradients. The guard must
  // cover the backward (DDP reads the flag when gradients arrive, not at forward).
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(std::shared_ptr<detail::Reducer> reducer);
    NoSyncGuard(NoSyncGuard&& other) noexcept;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    ~NoSyncGuard();

   private:
    std::shared_ptr<detail::Reducer> reducer_;
    bool previous_ = true;
  };
  [[nodiscard]] NoSyncGuard no_sync();

  // Replaces the default all_reduce-and-average; call once, before the first backward.
  void register_comm_hook(CommHook hook);
  // Adds a callback run for each bucket once its reduction completed and `.grad` holds the
  // result, in bucket order, on the thread running backward: during backward when DDP sees
  // the bucket done (it looks each time a gradient arrives), else when backward ends. With
  // find_unused_parameters, buckets holding a parameter that got no gradient in this
  // backward are completed at the end of backward.
  // The point in backward where a callback runs depends on timing and differs across ranks:
  // a callback that communicates must use another process group than DDP's (for example
  // `ddp.process_group().new_group(ddp.process_group().ranks())`, made once up front), where
  // its collectives are issued in the same (bucket) order on every rank.
  void register_bucket_reduced_callback(BucketReducedCallback callback);

  // Broadcasts rank 0's buffers (forward does this when broadcast_buffers is on; call it
  // yourself if you call the module's forward directly).
  void sync_buffers();
  // forward() calls it with the module's outputs. Backward through them then starts DDP's
  // bookkeeping on the outermost backward, also when the first gradients come from a backward
  // nested inside it (activation checkpointing's recomputation). With find_unused_parameters,
  // parameters that cannot reach `outputs` in the autograd graph are marked ready as soon as
  // backward starts, so their buckets need not wait for the end of backward (without this
  // call the unused ones are found at the end).
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);

  // The buckets' parameter names, in reduction order (for inspection and tests).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  size_t num_buckets() const;

  // What forward() does before calling the module: inside a Join, notify it and tell the
  // joined ranks whether this iteration's backward synchronizes; broadcast the buffers if
  // enabled (inside a Join from the highest rank still training, as rank 0 may have joined).
  // Call it yourself before the module's forward if you do not go through forward().
  void pre_forward();

  // PyTorch's `with ddp_model.join(divide_by_initial_world_size, enable,
  // throw_on_early_termination):` -- runs `body` (this rank's training loop) in
  // fsdpp::Join({this}). To join DDP with other joinables (ZeroRedundancyOptimizer), pass it
  // to fsdpp::Join yourself, first: Join({&ddp, &zero}).run(body) (then
  // divide_by_initial_world_size is true).
  void join(const std::function<void()>& body, DistributedDataParallelJoinOptions options = {});

  // Joinable. Each iteration under Join is one forward through DDP and its backward (or a
  // forward without gradients, or forward and backward both under no_sync()). A joined rank's
  // hook shadows the forward's collectives and, when the ranks still training synchronize, the
  // backward's: every bucket's reduction with zeros, in bucket order (through the comm hook if
  // one is registered), then writes the result to its `.grad` and runs the bucket-reduced
  // callbacks as they do (so a ZeroRedundancyOptimizer after DDP in the Join steps the joined
  // rank's partition with the averaged gradients). The post hook gives every rank the
  // parameters (and buffers with broadcast_buffers) of the highest rank among the last to
  // join, since joined ranks did not step. static_graph is refused until its first
  // synchronized backward has recorded the graph (do one iteration before the Join).
  std::unique_ptr<JoinHook> join_hook() override;
  ProcessGroup join_process_group() const override;
  c10::Device join_device() const override;

 protected:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<detail::Reducer> reducer_;

 private:
  friend class detail::DDPJoinHook;
  void pre_forward_in_join();
  // `in_join`: the joinable that stands for this DDP in the Join.
  std::unique_ptr<JoinHook> join_hook_for(Joinable* in_join, bool divide_by_initial_world_size);
};

namespace detail {
// Collects the tensors in a forward's output (a Tensor, a vector of them, a tuple or pair).
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}  // anything else holds no tensors
inline void collect_tensors(const at::Tensor& t, std::vector<at::Tensor>& out) { out.push_back(t); }
inline void collect_tensors(const std::vector<at::Tensor>& ts, std::vector<at::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out);
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out);

template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& t, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... e) { (collect_tensors(e, out), ...); }, t);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& p, std::vector<at::Tensor>& out) {
  collect_tensors(p.first, out);
  collect_tensors(p.second, out);
}
}  // namespace detail

// DDP over a module of a known type: module() is typed, and forward(args...) calls the
// module's forward (broadcasting buffers first when broadcast_buffers is on).
template <typename ModuleImpl>
class DistributedDataParallel : public DistributedDataParallel<torch::nn::Module> {
  using Base = DistributedDataParallel<torch::nn::Module>;

 public:
  DistributedDataParallel(torch::nn::ModuleHolder<ModuleImpl> module, DistributedDataParallelOptions options = {})
      : Base(std::static_pointer_cast<torch::nn::Module>(module.ptr()), std::move(options)), typed_(module.ptr()) {}
  DistributedDataParallel(std::shared_ptr<ModuleImpl> module, DistributedDataParallelOptions options = {})
      : Base(std::static_pointer_cast<torch::nn::Module>(module), std::move(options)), typed_(std::move(module)) {}

  const std::shared_ptr<ModuleImpl>& module() const { return typed_; }

  template <typename... Args>
  auto forward(Args&&... args) {
    pre_forward();
    auto output = typed_->forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    prepare_for_backward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

 private:
  std::shared_ptr<ModuleImpl> typed_;
};

template <typename ModuleImpl>
DistributedDataParallel(torch::nn::ModuleHolder<ModuleImpl>, DistributedDataParallelOptions = {})
    -> DistributedDataParallel<ModuleImpl>;
template <typename ModuleImpl>
DistributedDataParallel(std::shared_ptr<ModuleImpl>, DistributedDataParallelOptions = {})
    -> DistributedDataParallel<ModuleImpl>;

// FSDP2's composable API (torch.distributed._composable.replicate): DDP over `module`.
// Keep the returned object: the gradients are averaged only while it (or a copy) lives.
template <typename ModuleImpl>
[[nodiscard]] DistributedDataParallel<ModuleImpl> replicate(torch::nn::ModuleHolder<ModuleImpl> module,
                                                            DistributedDataParallelOptions options = {}) {
  return DistributedDataParallel<ModuleImpl>(std::move(module), std::move(options));
}
template <typename ModuleImpl>
[[nodiscard]] DistributedDataParallel<ModuleImpl> replicate(std::shared_ptr<ModuleImpl> module,
                                                            DistributedDataParallelOptions options = {}) {
  return DistributedDataParallel<ModuleImpl>(std::move(module), std::move(options));
}

}  // namespace fsdpp

#pragma once
// Fully sharded data parallel (PyTorch's FSDP): the FSDP1-style wrapper
// fsdpp::FullyShardedDataParallel over the FSDP2 engine (per-parameter dim-0 sharding).
//
//   torch::manual_seed(0);                                    // the same model on every rank
//   auto block = fsdpp::FullyShardedDataParallel<torch::nn::LinearImpl>(torch::nn::Linear(7, 15));
//   torch::nn::Sequential net(block, torch::nn::ReLU(), torch::nn::Linear(15, 3));
//   auto model = fsdpp::FullyShardedDataParallel<torch::nn::SequentialImpl>(net);  // the root
//   torch::optim::Adam opt(model->parameters(), 1e-2);         // after wrapping: holds the shards
//   auto loss = model->forward(x).mean();                      // each rank its own batch slice
//   loss.backward();                                           // .grad = this rank's shard of the mean gradient
//   opt.step();
//
// Wrapping shards every parameter of the wrapped module that no inner wrapper owns: each is
// split on dim 0 into group-size chunks of ceil(dim0 / size) rows (the last chunks padded),
// and the module's own parameter tensors (same TensorImpl) then hold this rank's rows: shape
// (rows of this rank, trailing dims...); a 0-dim parameter becomes 1-D. forward() all-gathers
// the unit's parameters (one flat buffer per unit), points each parameter at a view of the
// full value, runs the wrapped module's forward, and reshards afterwards when
// reshard_after_forward is set (never for the root: the outermost wrapper that ran forward
// first). Backward re-gathers resharded units before their backward, then reduce-scatters the
// gradient averaged over the group into each parameter's shard-shaped `.grad`, adding to a
// `.grad` that was not zeroed. Parameters are back to shards when backward ends.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/forward_arguments.h>
#include <fsdpp/fully_shard_options.h>
#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>
#include <fsdpp/tensor_layout.h>

namespace torch::nn {
class SequentialImpl;
}

namespace fsdpp {

namespace detail {
class FSDPState;
}

// What unshard(async_op = true) returns: wait() finishes the all-gather and installs the
// unsharded parameters.
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::weak_ptr<detail::FSDPState> state) : state_(std::move(state)) {}
  void wait();

 private:
  std::weak_ptr<detail::FSDPState> state_;
};

// One parameter as its unit holds it (in FSDP2 the parameter is a DTensor; here its layout
// travels beside it): what state dicts and checkpoints read and write.
struct ShardedParameter {
  std::string name;        // relative to the wrapped module
  at::Tensor param;        // the module's parameter (its shard at rest)
  at::Tensor local_shard;  // this rank's rows, also while the unit is unsharded
  TensorLayout layout;     // its global shape, Shard(0) over the unit's group
};

// The untyped part of every FullyShardedDataParallel (FSDP2's FSDPModule): everything but
// the typed forward. Find the units of a model with dynamic_cast over model->modules().
class FSDPModule : public torch::nn::Module {
 public:
  ~FSDPModule() override;

  // All-gathers this unit's parameters (only this unit's, not inner units') and makes them
  // full tensors. With async_op, the gather runs in the background until handle.wait() or
  // the next forward.
  UnshardHandle unshard(bool async_op = false);
  // Makes this unit's parameters shards again and frees the gathered memory.
  void reshard();
  // Off: backward keeps full gradients inside FSDP (summed over backwards) and communicates
  // nothing; the first backward with it on reduce-scatters the sum into `.grad` (gradient
  // accumulation without communication, like DDP's no_sync). Applies to this unit and, with
  // recurse, to the units inside it.
  void set_requires_gradient_sync(bool value, bool recurse = true);
  // HSDP only (FSDP2's set_requires_all_reduce): off, backward reduce-scatters within the shard
  // group but keeps the result instead of all-reducing it across replicas; the next backward
  // with it on adds the kept sums and all-reduces once (fewer bytes across nodes per step).
  void set_requires_all_reduce(bool value, bool recurse = true);
  // Off: a backward without gradient sync leaves this unit's parameters unsharded, so the
  // next microbatch's forward gathers nothing. A backward that syncs always reshards (the
  // gradients are shard-shaped and belong to the shards).
  void set_reshard_after_backward(bool value, bool recurse = true);
  // Units whose all-gather this unit's forward (backward) starts after waiting for its own (in
  // backward under BACKWARD_POST: in this unit's post-backward), in this order; replaces the
  // implicit prefetch of the next (previous) unit. Every rank must set the same. An empty list
  // turns prefetching off for this unit.
  void set_modules_to_forward_prefetch(const std::vector<std::shared_ptr<FSDPModule>>& modules);
  void set_modules_to_backward_prefetch(const std::vector<std::shared_ptr<FSDPModule>>& modules);
  // Changes reshard_after_forward of this unit (and of the inner units with recurse).
  void set_reshard_after_forward(bool value, bool recurse = true);
  // Only a bool, as PyTorch's (an int here would silently mean true).
  template <typename T>
  void set_reshard_after_forward(T value, bool recurse = true) = delete;
  // Off: the end of the next backward does not wait for the gradient reduce-scatters (more
  // microbatches follow); `.grad` is complete after a backward with it on (the default).
  // Set on the root; it applies to the whole tree.
  void set_is_last_backward(bool value);

  // On: forward runs the wrapped module under activation checkpointing, inside the unit's
  // gather (FSDP(checkpoint_wrapper(module))), so backward recomputes it after gathering again.
  // apply_activation_checkpointing turns it on when its policy selects the wrapped module.
  // Throws for a wrapped forward that takes or returns no tensor.
  void set_checkpoint_wrapped_module(bool value);
  bool checkpoints_wrapped_module() const { return checkpoint_wrapped_module_; }

  // The wrapped module.
  const std::shared_ptr<torch::nn::Module>& wrapped_module() const { return module_; }
  // This unit's reshard_after_forward now (set_reshard_after_forward changes it; SHARD_GRAD_OP
  // and NO_SHARD make it false). A unit without parameters to shard reports false.
  ReshardPolicy reshard_after_forward() const;
  const ProcessGroup& process_group() const;
  // True once this unit ran forward as the outermost unit.
  bool is_root() const;
  // Names (relative to the wrapped module) of the parameters this unit shards.
  std::vector<std::string> sharded_parameter_names() const;
  // Elements of this unit's flat all-gather buffer (all ranks' padded shards).
  int64_t unsharded_padded_numel() const;
  // The device this unit computes on: FullyShardOptions::device_id, else its parameters' device
  // (the CPU for parameters built under deferred_init, and for a unit without parameters).
  at::Device compute_device() const;

  // For deferred init (<fsdpp/deferred_init.h> uses these):
  // Whether this unit's parameters were built on the meta device and hold no values yet.
  bool has_deferred_parameters() const;
  // Gives them values (materialize_module calls it once per unit): while `init` runs they are
  // full tensors in their own dtype, in host memory on this rank alone (no collective), holding
  // no values until `init` writes every one; then this rank's rows become the shards and the
  // full copy is freed. If `init` throws, the shards are left as they were. Not while the unit
  // is gathered (throws). A unit without parameters to shard: nothing.
  void materialize_parameters(const std::function<void()>& init);
  // Takes the shards as they are, for a load to fill them (to_empty calls it).
  void mark_parameters_materialized();

  // For state dicts and checkpoints (<fsdpp/state_dict.h> uses these):
  // The parameters this unit shards, in its order.
  std::vector<ShardedParameter> sharded_parameters() const;
  // Their full values (copies, in the same order), by the unit's own all-gather; the unit stays
  // as it was. Collective over the unit's group. The values are views of one buffer (the unit's
  // gathered copy), which lives while any of them does; clone() one to keep it alone.
  std::vector<at::Tensor> full_parameters() const;
  // The LOCAL state dict's value of this unit: its parameters flattened and concatenated
  // (global size: their total numel), each parameter's rows on the rank that holds them.
  ShardedTensor flat_parameter() const;
  // Each parameter's rows on this rank (shaped as its local shard) from a flat_parameter()
  // value, which may be sharded another way (another world size: collective over its group).
  std::vector<at::Tensor> local_rows_from_flat_parameter(const ShardedTensor& flat) const;

 protected:
  FSDPModule(std::shared_ptr<torch::nn::Module> module, FullyShardOptions options);

  // One forward of the unit around `invoke` (the typed wrapper's and the type-blind unit's):
  // gather (the root's lazy init first); the argument tensors in `inputs` that require grad
  // are replaced by aliases whose backward runs after the unit's backward and starts its
  // reduce-scatter; invoke() runs the wrapped module and returns its output tensors, which are
  // replaced by aliases whose backward first gathers the parameters again; then reshard.
  void forward_steps(const std::vector<at::Tensor*>& inputs, const std::function<std::vector<at::Tensor*>()>& invoke);
  // Whether the wrapped forward's signature can be checkpointed (it takes and returns tensors).
  virtual bool can_checkpoint_wrapped_module() const { return true; }

 private:
  friend class FullParamsGuard;
  static std::vector<std::weak_ptr<detail::FSDPState>> states_of(const std::vector<std::shared_ptr<FSDPModule>>& modules);
  // Calls f on this unit's state and, with recurse, on those of the units inside it.
  void for_each_state(bool recurse, const std::function<void(detail::FSDPState&)>& f);

  std::shared_ptr<torch::nn::Module> module_;
  MixedPrecisionPolicy mp_policy_;  // the forward's input and output casts
  std::shared_ptr<detail::FSDPState> state_;
  bool checkpoint_wrapped_module_ = false;
};

namespace detail {

// Gives the wrapper a non-template forward with exactly the wrapped signature, so
// Sequential, ModuleList and AnyModule hold it in the wrapped module's place.
template <typename Derived, typename Signature>
class FSDPForward;
template <typename Derived, typename R, typename... A>
class FSDPForward<Derived, R(A...)> {
 public:
  using Inputs = std::tuple<std::decay_t<A>...>;
  static constexpr bool checkpointable = !std::is_void_v<R> && may_hold_tensor<Inputs>::value;

  R forward(A... args) {
    Inputs inputs(std::forward<A>(args)...);
    auto* self = static_cast<Derived*>(this);
    if constexpr (checkpointable)
      if (self->checkpoints_wrapped_module())
        return self->template run_forward<R>(inputs, [self](auto&... a) {
          return CheckpointedForward<R(A...)>::call(self->typed_, Inputs(a...));
        });
    return self->template run_forward<R>(inputs, [self](auto&... a) { return self->typed_->forward(static_cast<A&&>(a)...); });
  }
};

}  // namespace detail

template <typename M, typename Signature = typename detail::forward_signature<M>::type>
class FullyShardedDataParallelImpl
    : public FSDPModule,
      public detail::FSDPForward<FullyShardedDataParallelImpl<M, Signature>, Signature> {
 public:
  explicit FullyShardedDataParallelImpl(std::shared_ptr<M> module, FullyShardOptions options = {})
      : FSDPModule(module, std::move(options)), typed_(std::move(module)) {}
  explicit FullyShardedDataParallelImpl(torch::nn::ModuleHolder<M> module, FullyShardOptions options = {})
      : FullyShardedDataParallelImpl(module.ptr(), std::move(options)) {}

  using detail::FSDPForward<FullyShardedDataParallelImpl<M, Signature>, Signature>::forward;

  // The wrapped module, typed.
  const std::shared_ptr<M>& module() const { return typed_; }

  // Calls M's method `method` (not forward: FSDP2's register_fsdp_forward_method) inside this
  // unit's forward steps: gather before, reshard after, backward triggers on its tensors
  // (never checkpointed: set_checkpoint_wrapped_module covers forward only).
  //   Model: patch_embeddings = vit->forward_method(&VisionTransformerImpl::forward_features, imgs);
  template <typename R, typename C, typename... P, typename... Args>
  R forward_method(R (C::*method)(P...), Args&&... args) {
    static_assert(std::is_base_of_v<C, M>, "forward_method: the method must be a member of the wrapped module");
    std::tuple<std::decay_t<P>...> inputs(std::forward<Args>(args)...);
    return run_forward<R>(inputs, [&](auto&... a) { return (typed_.get()->*method)(static_cast<P&&>(a)...); });
  }

 private:
  friend class detail::FSDPForward<FullyShardedDataParallelImpl<M, Signature>, Signature>;

  bool can_checkpoint_wrapped_module() const override {
    return detail::FSDPForward<FullyShardedDataParallelImpl<M, Signature>, Signature>::checkpointable;
  }

  template <typename R, typename Tuple, typename Invoke>
  R run_forward(Tuple& inputs, Invoke&& invoke) {
    if constexpr (std::is_void_v<R>) {
      forward_steps(detail::tensors_in(inputs), [&] {
        std::apply(invoke, inputs);
        return std::vector<at::Tensor*>{};
      });
    } else {
      std::optional<R> output;
      forward_steps(detail::tensors_in(inputs), [&] {
        output.emplace(std::apply(invoke, inputs));
        return detail::tensors_in(*output);
      });
      return std::move(*output);
    }
  }

  std::shared_ptr<M> typed_;
};

// The module holder (like torch::nn::Linear for LinearImpl):
//   fsdpp::FullyShardedDataParallel<torch::nn::LinearImpl> fc(torch::nn::Linear(7, 15), options);
//   fsdpp::FullyShardedDataParallel fc2(torch::nn::Linear(7, 15));    // deduced
template <typename M, typename Signature = typename detail::forward_signature<M>::type>
class FullyShardedDataParallel : public torch::nn::ModuleHolder<FullyShardedDataParallelImpl<M, Signature>> {
 public:
  using torch::nn::ModuleHolder<FullyShardedDataParallelImpl<M, Signature>>::ModuleHolder;
};

template <typename M>
FullyShardedDataParallel(torch::nn::ModuleHolder<M>) -> FullyShardedDataParallel<M>;
template <typename M>
FullyShardedDataParallel(torch::nn::ModuleHolder<M>, FullyShardOptions) -> FullyShardedDataParallel<M>;
template <typename M>
FullyShardedDataParallel(std::shared_ptr<M>) -> FullyShardedDataParallel<M>;
template <typename M>
FullyShardedDataParallel(std::shared_ptr<M>, FullyShardOptions) -> FullyShardedDataParallel<M>;

// FSDP2's spelling: fully_shard(module, options) makes `module` a unit and returns its wrapper,
// which the caller uses in the module's place (libtorch has no forward hooks):
//   for (...) blocks->push_back(fsdpp::fully_shard(Block(...), opts));   // blocks first,
//   auto model = fsdpp::fully_shard(net, opts);                             // then the root
// With an auto_wrap_policy in the options it also wraps the selected submodules.
template <typename M>
FullyShardedDataParallel<M> fully_shard(torch::nn::ModuleHolder<M> module, FullyShardOptions options = {}) {
  return FullyShardedDataParallel<M>(module.ptr(), std::move(options));
}
template <typename M>
FullyShardedDataParallel<M> fully_shard(std::shared_ptr<M> module, FullyShardOptions options = {}) {
  return FullyShardedDataParallel<M>(std::move(module), std::move(options));
}

// FSDP1's summon_full_params: while the returned guard lives, every unit in `module` (the
// module itself included) holds its full parameters, e.g. to read or edit them. Collective:
// every rank of the units' groups calls it. With writeback, edits are kept (each rank keeps
// its rows); without, they are discarded. Not during a forward or backward.
//   { auto full = fsdpp::summon_full_params(*model); model->parameters()[0].mul_(0.5); }
class [[nodiscard]] FullParamsGuard {
 public:
  FullParamsGuard(torch::nn::Module& module, bool writeback);
  ~FullParamsGuard();
  FullParamsGuard(FullParamsGuard&&) = default;
  FullParamsGuard(const FullParamsGuard&) = delete;
  FullParamsGuard& operator=(const FullParamsGuard&) = delete;
  FullParamsGuard& operator=(FullParamsGuard&&) = delete;

 private:
  bool writeback_;
  std::vector<std::shared_ptr<detail::FSDPState>> states_;        // the units this guard unsharded
  std::vector<std::shared_ptr<detail::FSDPState>> already_full_;  // unsharded before, full precision
  std::vector<std::shared_ptr<detail::FSDPState>> regather_;      // unsharded before, lower precision
};

FullParamsGuard summon_full_params(torch::nn::Module& module, bool writeback = true);

}  // namespace fsdpp

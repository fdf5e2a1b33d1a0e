#pragma once
// What fully_shard and FullyShardedDataParallel take (FSDP2's _fsdp_api and FSDP1's api):
// FullyShardOptions and the policies inside it, in libtorch's options style (TORCH_ARG: a setter
// `name(value)` returning the options, a getter `name()`).
//
//   auto opts = fsdpp::FullyShardOptions()
//                   .reshard_after_forward(2)                    // FSDP2's int: 2-way copy kept
//                   .mp_policy(fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16))
//                   .auto_wrap_policy(fsdpp::ModuleWrapPolicy<BlockImpl>());   // <fsdpp/wrap_policy.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/modules/container/any.h>

#include <fsdpp/device_mesh.h>
#include <fsdpp/process_group.h>

namespace fsdpp {

// FSDP2's MixedPrecisionPolicy: the dtypes a unit computes, communicates and returns in, while
// its sharded parameters, their gradients and the optimizer state keep the parameters' own dtype
// (float32 as a rule).
struct MixedPrecisionPolicy {
  // The dtype of the unsharded parameters the module computes with; the all-gather moves this
  // dtype (half the bytes of float32 for bfloat16 / float16). Unset: the parameters' dtype.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype);
  // The dtype gradients are reduce-scattered in, before they land in the sharded `.grad` in the
  // parameters' dtype. Unset: param_dtype (the dtype autograd produced them in).
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype);
  // Floating-point tensors the unit's forward returns are cast to this dtype. Unset: as computed.
  TORCH_ARG(std::optional<at::ScalarType>, output_dtype);
  // Floating-point tensors passed to the unit's forward are cast to param_dtype (when set).
  TORCH_ARG(bool, cast_forward_inputs) = true;

 public:
  // Throws naming `unit` if a dtype set is not floating point.
  void check(const std::string& unit) const;
};

// FSDP2's OffloadPolicy (no offload: the shards stay on the compute device) and
// CPUOffloadPolicy (FSDP1's CPUOffload(offload_params=True)). With CPU offload the sharded
// parameters, their `.grad` shards and so the optimizer state live in host memory, and the
// optimizer steps on the CPU. Each all-gather copies the shards to the compute device (the
// device the parameters were on when the module was wrapped) and each reduce-scatter's output
// is copied back to the host. The unsharded parameters, activations and gradients during
// backward stay on the compute device.
struct OffloadPolicy {
  // Set by CPUOffloadPolicy only (one way to ask for offload, with its pin_memory default).
  bool offload_to_cpu() const { return offload_to_cpu_; }
  // Page-locked host memory, for asynchronous copies to an accelerator. Only applies when the
  // compute device is not the CPU (a CPU-only libtorch cannot pin memory, and nothing is copied).
  TORCH_ARG(bool, pin_memory) = false;

 protected:
  bool offload_to_cpu_ = false;
};

struct CPUOffloadPolicy : OffloadPolicy {
  CPUOffloadPolicy() {
    offload_to_cpu_ = true;
    pin_memory(true);
  }
};

// FSDP2's reshard_after_forward: what a unit does with its gathered parameters after forward.
// A bool: free them after forward and gather again for backward (true), or keep them until
// backward (false). An int k: keep a copy sharded k ways across k consecutive ranks of the
// group, so backward gathers within those k ranks only; k = 1 means false and k = the group
// size means true, k must divide the group size, and k < 1 is refused, as PyTorch does. Any
// other type is refused at compile time: 2 means two ways, never `true`.
class ReshardPolicy {
 public:
  ReshardPolicy(bool reshard = true) : fully_(reshard), ways_(reshard ? 0 : 1) {}  // NOLINT: implicit, as FSDP2's bool
  ReshardPolicy(int k) : ways_(k) {}                                                // NOLINT: implicit, as FSDP2's int
  template <typename T>
  ReshardPolicy(T) = delete;

  // Whether the unsharded parameters are freed after forward.
  bool reshards() const { return fully_ || ways_ != 1; }
  // k of the copy kept after forward; 0 when none is kept (true, false, or k = group size).
  int post_forward_size(int group_size) const { return !fully_ && ways_ > 1 && ways_ < group_size ? ways_ : 0; }
  // Throws naming `unit` and the group unless this is a bool or a positive divisor of group_size.
  void check(int group_size, const std::string& unit, const std::string& group) const;
  // "true", "false" or k.
  std::string to_string() const;

 private:
  bool fully_ = false;  // true
  int ways_;           // k when not fully_ (false is 1)
};

// FSDP1's BackwardPrefetch: when a unit starts the all-gather of the unit whose backward runs
// after its own.
enum class BackwardPrefetch {
  // At the start of this unit's backward (PyTorch's default, and FSDP2's only choice): the
  // gather overlaps this unit's whole backward, but the unit's parameters, its gradients and
  // the prefetched parameters are then alive together.
  BACKWARD_PRE,
  // In this unit's post-backward, once its parameters are freed and its gradients packed into
  // the reduce-scatter input: the gather overlaps no backward compute, and that reduce-scatter
  // waits behind it on the comm thread, so its input (one unit) is still alive when the target
  // unit's backward starts. The parameters, gradients and prefetch of BACKWARD_PRE never
  // coexist, but the peak is lower only if that reduce-scatter finishes before the target's
  // first gradients exist (docs/benchmarks.md measures it).
  BACKWARD_POST,
  // fsdpp's default: BACKWARD_PRE at the units where it keeps the step within its bound (the
  // larger of: the memory alive at the end of forward plus two of the largest unit, the
  // backward's peak without prefetch), none elsewhere. The first backward prefetches nothing
  // and measures each unit's peak from its gather to the next unit's pre-backward; then the
  // ranks agree on the minimum, so every rank issues its collectives in one order. In a
  // transformer the early units of backward do not prefetch (the activations are all alive),
  // the later ones do (docs/api.md, docs/benchmarks.md).
  BACKWARD_PRE_WITHIN_BOUND,
};

// FSDP1's ShardingStrategy: how a unit spreads its parameters over the ranks.
enum class ShardingStrategy {
  // Parameters, gradients and optimizer state sharded over the group; parameters regathered for
  // backward (reshard_after_forward as set, true by default).
  FULL_SHARD,
  // As FULL_SHARD but the gathered parameters stay from forward to backward
  // (reshard_after_forward(false)).
  SHARD_GRAD_OP,
  // Nothing sharded: every rank holds the whole parameters and gradients are all-reduced, as
  // DistributedDataParallel does (HSDP with shard groups of one rank).
  NO_SHARD,
  // HSDP: sharded within each node (LOCAL_WORLD_SIZE consecutive ranks) and replicated across
  // nodes; a 2-D mesh (replicate, shard) says it explicitly.
  HYBRID_SHARD,
};

const char* to_string(ShardingStrategy s);

struct FullyShardOptions;

// FSDP1's auto_wrap_policy: which submodules of a module being wrapped become units of their own
// (and, for apply_activation_checkpointing, which get checkpointed). <fsdpp/wrap_policy.h> makes
// them: ModuleWrapPolicy<Ts...>(), SizeBasedAutoWrapPolicy(n).
struct AutoWrapPolicy {
  // Whether `module` becomes a unit; `unwrapped_numel` counts its parameters that no unit
  // inside it shards (the policy runs bottom-up).
  std::function<bool(const torch::nn::Module& module, int64_t unwrapped_numel)> should_wrap;
  // Builds the typed unit of a selected module; empty for policies that do not know the
  // type (they wrap only Sequential elements, through their AnyModule).
  std::function<torch::nn::AnyModule(const std::shared_ptr<torch::nn::Module>&, const FullyShardOptions&)> make_unit;
  // The same for apply_activation_checkpointing: the typed checkpoint wrapper of a selected
  // module, or empty (Sequential elements then get a type-blind one).
  std::function<torch::nn::AnyModule(const std::shared_ptr<torch::nn::Module>&)> make_checkpoint_wrapper;
};

struct FullyShardOptions {
  // The group the parameters are sharded across; empty means the default group.
  TORCH_ARG(ProcessGroup, process_group);
  // A 1-D mesh to shard across (its group), or a 2-D mesh (replicate, shard) for HSDP: shard
  // across the last dimension, replicate across the first (FSDP2's mesh argument).
  TORCH_ARG(DeviceMesh, mesh);
  // FSDP1's sharding_strategy. Unset: FULL_SHARD, or HSDP with a 2-D mesh.
  TORCH_ARG(std::optional<ShardingStrategy>, sharding_strategy);
  // A bool or an int k (ReshardPolicy above); true by default. Ignored by the root, which keeps
  // its parameters.
  TORCH_ARG(ReshardPolicy, reshard_after_forward);
  // FSDP1's backward_prefetch: when this unit starts the all-gather of the unit whose backward
  // follows its own. std::nullopt: no implicit backward prefetch (a
  // set_modules_to_backward_prefetch list still runs, at the start of backward, as it does
  // under BACKWARD_PRE_WITHIN_BOUND).
  TORCH_ARG(std::optional<BackwardPrefetch>, backward_prefetch) = BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND;
  // Makes units of the submodules the policy selects before wrapping this module, as FSDP1's
  // auto_wrap_policy; they get these options too.
  TORCH_ARG(std::shared_ptr<const AutoWrapPolicy>, auto_wrap_policy);
  // Computes in, communicates in and returns the dtypes the policy names; the sharded
  // parameters keep theirs.
  TORCH_ARG(MixedPrecisionPolicy, mp_policy);
  // Keeps the sharded parameters, their gradients and the optimizer state in host memory:
  // CPUOffloadPolicy(), as FSDP2's offload_policy.
  TORCH_ARG(OffloadPolicy, offload_policy);
  // Parameters FSDP leaves alone (FSDP2's ignored_params): whole on every rank, never gathered,
  // and their gradients not reduced (the caller synchronizes them if it wants to). Each must be
  // a parameter of the wrapped module.
  TORCH_ARG(std::vector<at::Tensor>, ignored_params);
  // FSDP1's ignored_modules: every parameter of these submodules (or of the wrapped module
  // itself) is ignored as above, and an auto-wrap policy makes no unit of them.
  TORCH_ARG(std::vector<std::shared_ptr<torch::nn::Module>>, ignored_modules);
  // FSDP1's device_id (FSDP2 takes it from its mesh): the device the unit computes on, e.g.
  // cuda:LOCAL_RANK. Parameters on the CPU are sharded straight onto it, so the whole model never
  // lands there, and the wrapped module's buffers move there; parameters built under
  // deferred_init get their shards there (materialize_module initializes them on the host, with
  // the same values as on the CPU). The root moves its forward's tensor inputs there. Unset: the
  // parameters' own device (the CPU for deferred ones). Parameters already on another
  // accelerator are an error naming them.
  TORCH_ARG(std::optional<at::Device>, device_id);
  // FSDP1's sync_module_states: each unit's parameters and buffers take rank 0's values
  // (rank 0 of the shard group, then of the replicate group), broadcast one unit at a time, so
  // only rank 0 needs them: the other ranks may build the model under deferred_init.
  TORCH_ARG(bool, sync_module_states) = false;
};

}  // namespace fsdpp

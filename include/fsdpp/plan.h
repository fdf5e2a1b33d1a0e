#pragma once
// fsdpp-plan's estimator: per-rank memory and bytes on the wire of one FSDP training step, from a
// transformer's shape and a parallel layout, without building or running the model.
//
//   auto plan = fsdpp::plan::plan_step(fsdpp::plan::ModelShape::llama(32, 4096, 32, 8, 14336, 128256)
//                                          .seq(8192).batch(1),
//                                      fsdpp::plan::ParallelLayout().world_size(64)
//                                          .param_dtype(at::kBFloat16).activation_checkpointing(true));
//   std::cout << fsdpp::plan::format_plan(plan);
//
// Memory comes from replaying the step's allocations and frees: FSDP's schedule (what
// fully_shard gathers, prefetches, reshards, packs and reduce-scatters, and when) over a count of
// what autograd saves in each op of the block, the ends and the loss (docs/plan.md). The peaks
// are above the state held between steps, as bench_fsdp measures them: after libtorch's
// zero_grad() dropped the gradient shards.
#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

namespace torch::nn {
class Module;
}

namespace fsdpp {
struct AutoWrapPolicy;
}

namespace fsdpp::plan {

// kExampleTransformer: examples/transformer.h (LayerNorm, learned positions, GELU MLP with
// biases, multi-head attention). kLlama: RMSNorm, rotary positions, SwiGLU without biases,
// grouped-query attention, no learned positions.
enum class Architecture { kExampleTransformer, kLlama };
// kExplicit: scores and softmax materialized and saved (the CPU path of examples/transformer.h);
// kFused: a flash-style kernel saving q, k, v, its output and the log-sum-exp only.
enum class AttentionKernel { kExplicit, kFused };
enum class Optimizer { kAdam, kSGD, kSGDMomentum };
// BACKWARD_PRE: a unit's pre-backward gathers the next unit to run backward; kNone: each unit
// gathers at its own pre-backward; kBounded: fully_shard's default, BACKWARD_PRE_WITHIN_BOUND
// (docs/api.md), replayed: a replay without prefetch measures each unit's window as the first
// backward does, and a unit prefetches the next iff its window (+ a reduce-scatter input held
// over) + the next unit, and the next unit's window + this unit's reduce-scatter input and
// output, stay within max(the highest window, live after forward + 2 x the largest unit).
// (Decided for `rank`'s shard sizes; the engine takes every rank's agreement.)
enum class BackwardPrefetch { kBackwardPre, kNone, kBounded };

struct ModelShape {
  // examples/transformer.h's defaults as bench_fsdp runs it (4 layers, dim 256, 4 heads, vocab
  // 1024, sequences of 32, 2 per rank).
  ModelShape() = default;
  // A Llama-shaped model (fused attention, untied embeddings).
  static ModelShape llama(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn_hidden,
                          int64_t vocab);

  TORCH_ARG(Architecture, architecture) = Architecture::kExampleTransformer;
  TORCH_ARG(int64_t, layers) = 4;
  TORCH_ARG(int64_t, dim) = 256;
  TORCH_ARG(int64_t, heads) = 4;
  TORCH_ARG(int64_t, kv_heads) = 0;    // 0: as many as heads
  TORCH_ARG(int64_t, ffn_hidden) = 0;  // 0: 4 x dim
  TORCH_ARG(int64_t, vocab) = 1024;
  TORCH_ARG(int64_t, seq) = 32;
  TORCH_ARG(int64_t, batch) = 2;  // sequences per rank (per data-parallel rank)
  TORCH_ARG(bool, tied_embeddings) = false;
  TORCH_ARG(AttentionKernel, attention) = AttentionKernel::kExplicit;
};

struct ParallelLayout {
  TORCH_ARG(int64_t, world_size) = 1;
  TORCH_ARG(int64_t, replicate) = 1;        // HSDP: replicas of each shard group
  TORCH_ARG(int64_t, tensor_parallel) = 1;  // TP degree (Megatron-style blocks, vocab-parallel ends)
  TORCH_ARG(bool, reshard_after_forward) = true;
  TORCH_ARG(c10::ScalarType, param_dtype) = c10::ScalarType::Float;   // what units compute in
  TORCH_ARG(c10::ScalarType, reduce_dtype) = c10::ScalarType::Float;  // what gradients are reduced in
  TORCH_ARG(bool, activation_checkpointing) = false;                   // every block
  TORCH_ARG(bool, cpu_offload) = false;  // sharded parameters, gradients and optimizer state on the host
  TORCH_ARG(Optimizer, optimizer) = Optimizer::kAdam;
  TORCH_ARG(BackwardPrefetch, backward_prefetch) = BackwardPrefetch::kBounded;  // fully_shard's default
  TORCH_ARG(int64_t, rank) = 0;  // whose shard sizes (rank 0 holds the most rows)
};

// One FSDP unit (the root: embeddings, final norm, output projection; then one per block).
struct UnitPlan {
  std::string name;
  int64_t numel = 0;                   // parameters on this TP rank
  int64_t shard_padded_numel = 0;      // the rank's padded flat shard
  int64_t unsharded_padded_numel = 0;  // what an all-gather rebuilds
  int64_t local_numel = 0;             // the rank's real rows
};

// Bytes per rank.
struct StepPlan {
  std::vector<UnitPlan> units;
  int64_t shard_group_size = 1;
  // Held between steps (on the host under CPU offload, then 0 on the device).
  int64_t parameters = 0, gradients = 0, optimizer_state = 0;
  int64_t host_parameters = 0, host_gradients = 0, host_optimizer_state = 0;
  // Saved by autograd at the end of forward (the loss included).
  int64_t activations = 0;
  int64_t root_unit = 0, largest_unit = 0;  // gathered bytes, padded, in param_dtype
  // Above the state held between steps (its gradient shards dropped by zero_grad), as bench_fsdp
  // measures: the forward's peak, what forward leaves, and the step's peak through backward, with
  // the comm thread keeping up (a gather's output allocated as it is issued, a reduce-scatter's
  // input freed before the next unit computes).
  int64_t forward_peak = 0, after_forward = 0, backward_peak = 0;
  // Each peak over the two orders of the comm thread's allocations and frees against the compute
  // thread's (docs/plan.md, "Timing"): that one, and the comm thread running each collective only
  // when the compute thread waits for it (a prefetch's output allocated at its wait, a
  // reduce-scatter's input and staging alive until then). The peak above is one end of
  // [low, high]; low == high where the order changes nothing.
  int64_t forward_peak_low = 0, forward_peak_high = 0, backward_peak_low = 0, backward_peak_high = 0;
  // At the backward peak: gathered parameters (computing and prefetched), unsharded gradients,
  // collective buffers (prefetched gathers, reduce-scatter input and outputs), activations and
  // their gradients.
  int64_t at_peak_parameters = 0, at_peak_gradients = 0, at_peak_comm = 0, at_peak_activations = 0,
          at_peak_activation_grads = 0;
  int64_t comm_buffers = 0;  // collective buffers at the backward peak (prefetch + reduce-scatter)
  int64_t held = 0;          // device bytes held between steps
  int64_t step_peak = 0;     // held + the larger peak
  int64_t step_peak_high = 0;  // held + the larger high end: what a device must hold in either order
  // Bytes this rank sends per step, by group kind.
  int64_t all_gather_bytes = 0, reduce_scatter_bytes = 0, replicate_all_reduce_bytes = 0, tp_all_reduce_bytes = 0;
};

StepPlan plan_step(const ModelShape& model, const ParallelLayout& layout);

// A model given as its parameter list instead: each unit's parameters' shapes. units_of cuts a
// module (built normally or under deferred_init: only shapes are read) the way fully_shard with
// `policy` as auto_wrap_policy does: every selected submodule a unit of the parameters no inner
// unit holds, the rest the root (first); a parameter shared by two modules counted once.
struct UnitShapes {
  std::string name;
  std::vector<std::vector<int64_t>> shapes;
};
std::vector<UnitShapes> units_of(const torch::nn::Module& model, const AutoWrapPolicy& policy);
// What the parameter list decides without a forward to count: held state, unit sizes and bytes
// on the wire (activations and peaks are left 0). No tensor parallelism (which weights a TP plan
// splits is the model's).
StepPlan plan_units(const std::vector<UnitShapes>& units, const ParallelLayout& layout);
// The replay behind plan_step: live bytes above the held state after each op and FSDP event.
std::string trace_step(const ModelShape& model, const ParallelLayout& layout);
// A table, one line per quantity (MiB and bytes).
std::string format_plan(const ModelShape& model, const ParallelLayout& layout, const StepPlan& plan);
// The most layers of `model`'s shape whose step peak fits in `limit` bytes per rank in either
// order of the comm thread (step_peak_high; 0 if none).
int64_t largest_fitting_layers(ModelShape model, const ParallelLayout& layout, int64_t limit);
// Parameters of the whole model (all TP ranks), for reporting a fitted size.
int64_t total_parameters(const ModelShape& model);

}  // namespace fsdpp::plan

// plan_step: the units' sizes (unit_shapes), the held state, the bytes on the wire per group
// kind, and the step's memory from the replay (step_replay over transformer_tape).
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/ScalarType.h>

#include <fsdpp/error.h>
#include <fsdpp/plan.h>

#include "comm/wire_bytes.h"
#include "plan/step_replay.h"
#include "plan/transformer_tape.h"
#include "plan/unit_shapes.h"

namespace fsdpp::plan {
namespace {

namespace wire = fsdpp::detail;  // comm/wire_bytes.h (plan::detail is the planner's own)

int64_t optimizer_states(Optimizer o) {
  switch (o) {
    case Optimizer::kAdam:
      return 2;
    case Optimizer::kSGDMomentum:
      return 1;
    case Optimizer::kSGD:
      return 0;
  }
  return 0;
}

// Sizes, held state and wire bytes of the units (params[0] the root), into `plan`; returns what
// the replay needs of each.
std::vector<detail::UnitBytes> account_units(const std::vector<std::vector<detail::ParamShape>>& params,
                                             const std::vector<std::string>& names, const ParallelLayout& layout,
                                             StepPlan& plan) {
  const int64_t replicas = layout.replicate();
  const int64_t shard_group = layout.world_size() / (layout.tensor_parallel() * replicas);
  const int64_t pbytes = static_cast<int64_t>(c10::elementSize(layout.param_dtype()));
  const int64_t rbytes = static_cast<int64_t>(c10::elementSize(layout.reduce_dtype()));
  constexpr int64_t kShardBytes = 4;  // sharded parameters, their .grad and the optimizer state: float32
  const bool offload = layout.cpu_offload();
  plan.shard_group_size = shard_group;
  std::vector<detail::UnitBytes> unit_bytes;
  for (size_t u = 0; u < params.size(); ++u) {
    const UnitPlan unit = detail::shard_unit(names[u], params[u], shard_group, layout.rank());
    plan.units.push_back(unit);
    detail::UnitBytes b;
    b.gathered = unit.unsharded_padded_numel * pbytes;
    b.gather_input = (pbytes != kShardBytes || offload) ? unit.shard_padded_numel * pbytes : 0;
    b.grads = unit.numel * pbytes;
    b.reduce_input = unit.unsharded_padded_numel * rbytes;
    b.reduce_output = unit.shard_padded_numel * rbytes;
    // A half-precision reduce-scatter sums in float32 on the comm thread
    // (src/comm/collective_algorithms.cpp, reduce_chunks): every rank's chunk received or staged
    // in the reduce dtype, those chunks as float32, and their float32 sum.
    if (shard_group > 1 && rbytes < 4)
      b.reduce_staging = b.reduce_input + b.reduce_input * 4 / rbytes + b.reduce_output * 4 / rbytes;
    b.grad_shard = offload ? 0 : unit.local_numel * kShardBytes;
    unit_bytes.push_back(b);

    const int64_t local = unit.local_numel * kShardBytes;
    (offload ? plan.host_parameters : plan.parameters) += local;
    (offload ? plan.host_gradients : plan.gradients) += local;
    (offload ? plan.host_optimizer_state : plan.optimizer_state) += optimizer_states(layout.optimizer()) * local;
    if (!offload) plan.held += unit.shard_padded_numel * kShardBytes;  // the padded flat shard
    plan.largest_unit = std::max(plan.largest_unit, b.gathered);
    if (u == 0) plan.root_unit = b.gathered;

    // Forward gathers every unit; backward again each non-root unit that resharded after forward.
    const int64_t gathers = 1 + (u > 0 && layout.reshard_after_forward() ? 1 : 0);
    // The collectives' own wire rule (comm/wire_bytes.h), as CommDebugMode counts them.
    plan.all_gather_bytes += gathers * wire::all_gather_wire_bytes(unit.shard_padded_numel * pbytes, shard_group);
    plan.reduce_scatter_bytes += wire::reduce_scatter_wire_bytes(unit.shard_padded_numel * rbytes, shard_group);
    plan.replicate_all_reduce_bytes += wire::ring_all_reduce_mean_bytes(unit.shard_padded_numel * rbytes, replicas);
  }
  plan.held += plan.gradients + plan.optimizer_state;
  return unit_bytes;
}

}  // namespace

ModelShape ModelShape::llama(int64_t layers, int64_t dim, int64_t heads, int64_t kv_heads, int64_t ffn_hidden,
                             int64_t vocab) {
  return ModelShape()
      .architecture(Architecture::kLlama)
      .layers(layers)
      .dim(dim)
      .heads(heads)
      .kv_heads(kv_heads)
      .ffn_hidden(ffn_hidden)
      .vocab(vocab)
      .attention(AttentionKernel::kFused);
}

int64_t total_parameters(const ModelShape& model) {
  int64_t n = 0;
  for (const auto& unit : detail::unit_params(model, 1))
    for (const auto& p : unit) n += p.numel();
  return n;
}

namespace {

StepPlan plan_and_trace(const ModelShape& model, const ParallelLayout& layout,
                        std::vector<std::pair<std::string, int64_t>>* trace) {
  detail::check_shape_and_layout(model, layout);
  const int64_t tp = layout.tensor_parallel();
  const int64_t pbytes = static_cast<int64_t>(c10::elementSize(layout.param_dtype()));
  StepPlan plan;
  const auto params = detail::unit_params(model, tp);
  std::vector<std::string> names{"root"};
  for (int64_t i = 0; i < model.layers(); ++i) names.push_back("block " + std::to_string(i));
  const std::vector<detail::UnitBytes> unit_bytes = account_units(params, names, layout, plan);

  // Tensor parallel: per block two all-reduces of (batch x seq x dim) in forward (after wo and
  // w2), two in backward (the gradients into the column-parallel inputs), two more when the
  // block's forward is recomputed; one in forward after the vocab-parallel embedding.
  const int64_t tokens_dim = model.batch() * model.seq() * model.dim() * pbytes;
  const int64_t per_block = 4 + (layout.activation_checkpointing() ? 2 : 0);
  plan.tp_all_reduce_bytes = wire::ring_all_reduce_mean_bytes(tokens_dim, tp) * (per_block * model.layers() + 1);

  detail::ReplayOptions options;
  options.reshard_after_forward = layout.reshard_after_forward();
  options.activation_checkpointing = layout.activation_checkpointing();
  options.backward_prefetch = layout.backward_prefetch();
  options.shard_group_size = plan.shard_group_size;
  options.trace = trace != nullptr;
  detail::ReplayResult r = detail::replay_step(detail::transformer_tape(model, tp, pbytes), unit_bytes, options);
  plan.activations = r.activations;
  plan.forward_peak = r.forward_peak;
  plan.after_forward = r.after_forward;
  plan.backward_peak = r.backward_peak;
  plan.at_peak_parameters = r.at_peak_params;
  plan.at_peak_gradients = r.at_peak_grads;
  plan.at_peak_comm = r.at_peak_comm;
  plan.at_peak_activations = r.at_peak_activations;
  plan.at_peak_activation_grads = r.at_peak_temporaries;
  plan.comm_buffers = r.at_peak_comm;
  plan.forward_peak_low = std::min(r.forward_peak, r.forward_peak_late);
  plan.forward_peak_high = std::max(r.forward_peak, r.forward_peak_in_flight);
  plan.backward_peak_low = std::min(r.backward_peak, r.backward_peak_late);
  plan.backward_peak_high = std::max(r.backward_peak, r.backward_peak_in_flight);
  plan.step_peak = plan.held + std::max(plan.forward_peak, plan.backward_peak);
  plan.step_peak_high = plan.held + std::max(plan.forward_peak_high, plan.backward_peak_high);
  if (trace) *trace = std::move(r.trace);
  return plan;
}

}  // namespace

StepPlan plan_step(const ModelShape& model, const ParallelLayout& layout) { return plan_and_trace(model, layout, nullptr); }

StepPlan plan_units(const std::vector<UnitShapes>& units, const ParallelLayout& layout) {
  detail::check_layout(layout);
  if (layout.tensor_parallel() != 1)
    throw Error("plan: a parameter list is planned without tensor parallelism (tensor_parallel " +
                std::to_string(layout.tensor_parallel()) + ")");
  if (units.empty()) throw Error("plan: no units (the root comes first, even when it holds no parameters)");
  std::vector<std::vector<detail::ParamShape>> params;
  std::vector<std::string> names;
  for (const auto& unit : units) {
    names.push_back(unit.name);
    params.emplace_back();
    for (size_t i = 0; i < unit.shapes.size(); ++i) {
      const auto& shape = unit.shapes[i];
      detail::ParamShape p{unit.name + "[" + std::to_string(i) + "]", shape.empty() ? 1 : shape[0], 1};
      for (size_t d = 1; d < shape.size(); ++d) p.row_numel *= shape[d];
      params.back().push_back(p);
    }
  }
  StepPlan plan;
  account_units(params, names, layout, plan);
  return plan;
}

std::string trace_step(const ModelShape& model, const ParallelLayout& layout) {
  std::vector<std::pair<std::string, int64_t>> events;
  plan_and_trace(model, layout, &events);
  std::string out;
  char text[200];
  for (const auto& [event, live] : events) {
    std::snprintf(text, sizeof text, "%12.4f MiB  %s\n", static_cast<double>(live) / (1 << 20), event.c_str());
    out += text;
  }
  return out;
}

int64_t largest_fitting_layers(ModelShape model, const ParallelLayout& layout, int64_t limit) {
  auto fits = [&](int64_t layers) { return plan_step(model.layers(layers), layout).step_peak_high <= limit; };
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace fsdpp::plan

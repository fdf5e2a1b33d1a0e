// format_plan: the plan as the table fsdpp-plan prints.
#include <algorithm>
#include <cstdio>
#include <string>

#include <fsdpp/plan.h>

namespace fsdpp::plan {
namespace {

std::string line(const char* label, int64_t bytes) {
  char text[160];
  std::snprintf(text, sizeof text, "  %-46s %12.3f MiB  %16lld\n", label, static_cast<double>(bytes) / (1 << 20),
                static_cast<long long>(bytes));
  return text;
}

// A peak over the comm thread's two orders: "low-high" where they differ.
std::string range_line(const char* label, int64_t low, int64_t high) {
  if (low == high) return line(label, low);
  char mib[64], bytes[64], text[200];
  std::snprintf(mib, sizeof mib, "%.3f-%.3f", static_cast<double>(low) / (1 << 20), static_cast<double>(high) / (1 << 20));
  std::snprintf(bytes, sizeof bytes, "%lld-%lld", static_cast<long long>(low), static_cast<long long>(high));
  std::snprintf(text, sizeof text, "  %-46s %12s MiB  %16s\n", label, mib, bytes);
  return text;
}

const char* prefetch_name(BackwardPrefetch p) {
  switch (p) {
    case BackwardPrefetch::kBackwardPre:
      return "BACKWARD_PRE";
    case BackwardPrefetch::kNone:
      return "none";
    case BackwardPrefetch::kBounded:
      return "bounded";
  }
  return "?";
}

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::kAdam:
      return "Adam";
    case Optimizer::kSGD:
      return "SGD";
    case Optimizer::kSGDMomentum:
      return "SGD with momentum";
  }
  return "?";
}

}  // namespace

std::string format_plan(const ModelShape& m, const ParallelLayout& l, const StepPlan& p) {
  char head[768];
  const int64_t kv = m.kv_heads() > 0 ? m.kv_heads() : m.heads(), ffn = m.ffn_hidden() > 0 ? m.ffn_hidden() : 4 * m.dim();
  std::snprintf(head, sizeof head,
                "model: %s, %lld layers, dim %lld, %lld heads (%lld kv), ffn %lld, vocab %lld%s, %s attention; "
                "%.3f B parameters\n"
                "step: %lld sequences of %lld per rank\n"
                "layout: %lld ranks = %lld replicas x %lld shard x %lld TP; reshard_after_forward %s; compute %s, "
                "reduce %s; activation checkpointing %s; CPU offload %s; %s; backward prefetch %s\n",
                m.architecture() == Architecture::kLlama ? "Llama" : "examples/transformer.h",
                static_cast<long long>(m.layers()), static_cast<long long>(m.dim()), static_cast<long long>(m.heads()),
                static_cast<long long>(kv), static_cast<long long>(ffn), static_cast<long long>(m.vocab()),
                m.tied_embeddings() ? " (tied)" : "", m.attention() == AttentionKernel::kFused ? "fused" : "explicit",
                static_cast<double>(total_parameters(m)) / 1e9, static_cast<long long>(m.batch()),
                static_cast<long long>(m.seq()), static_cast<long long>(l.world_size()),
                static_cast<long long>(l.replicate()), static_cast<long long>(p.shard_group_size),
                static_cast<long long>(l.tensor_parallel()), l.reshard_after_forward() ? "true" : "false",
                c10::toString(l.param_dtype()), c10::toString(l.reduce_dtype()),
                l.activation_checkpointing() ? "on" : "off", l.cpu_offload() ? "on" : "off",
                optimizer_name(l.optimizer()), prefetch_name(l.backward_prefetch()));
  std::string out = head;
  out += "per rank, device                                          MiB             bytes\n";
  out += line("parameters (sharded, float32)", p.parameters);
  out += line("gradients (sharded, float32)", p.gradients);
  out += line("optimizer state", p.optimizer_state);
  out += line("held between steps (padded shards + above)", p.held);
  out += line("activations (saved at the end of forward)", p.activations);
  out += line("largest unit, gathered", p.largest_unit);
  out += line("root unit, gathered (held through backward)", p.root_unit);
  out += line("communication buffers at the backward peak", p.comm_buffers);
  out += "  above the state held (gradient shards dropped by zero_grad); a peak low-high: the comm thread\n"
         "  keeping up or running each collective only when waited for (of which: keeping up):\n";
  out += range_line("  forward peak", p.forward_peak_low, p.forward_peak_high);
  out += line("  held after forward", p.after_forward);
  out += range_line("  backward peak", p.backward_peak_low, p.backward_peak_high);
  out += line("    of which gathered parameters", p.at_peak_parameters);
  out += line("    of which unsharded gradients", p.at_peak_gradients);
  out += line("    of which collective buffers", p.at_peak_comm);
  out += line("    of which activations", p.at_peak_activations);
  out += line("    of which temporaries and activation grads", p.at_peak_activation_grads);
  out += range_line("step peak (held + the larger peak)",
                    p.held + std::max(p.forward_peak_low, p.backward_peak_low), p.step_peak_high);
  if (l.cpu_offload()) {
    out += "per rank, host\n";
    out += line("parameters", p.host_parameters);
    out += line("gradients", p.host_gradients);
    out += line("optimizer state", p.host_optimizer_state);
  }
  out += "bytes sent per step per rank\n";
  out += line("shard group: all-gather", p.all_gather_bytes);
  out += line("shard group: reduce-scatter", p.reduce_scatter_bytes);
  out += line("replicate group (HSDP): all-reduce", p.replicate_all_reduce_bytes);
  out += line("TP group: all-reduce", p.tp_all_reduce_bytes);
  return out;
}

}  // namespace fsdpp::plan

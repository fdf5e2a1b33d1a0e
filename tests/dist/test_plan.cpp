// fsdpp-plan's estimate (include/fsdpp/plan.h) against a real FSDP step at N = 1..8, measured as
// bench_fsdp measures it: examples/transformer.h with every block a unit and the root holding the
// ends, Adam, the peaks of a step above what is held between steps (taken before zero_grad()
// drops the gradient shards), bytes sent per collective from CommDebugMode; with backward
// prefetch BACKWARD_PRE and none, without resharding after forward, in bfloat16 and with the
// blocks checkpointed, and with fully_shard's default prefetch (BACKWARD_PRE_WITHIN_BOUND, the
// plan's kBounded). Exact where the
// quantity is a count of elements (held state, unit sizes, wire bytes), within 10 % for the
// memory the step's schedule and autograd decide; where the comm thread's timing moves a peak by
// more, within 10 % of the plan's range over the two orders of the comm thread's work.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/memory.h>
#include <fsdpp/plan.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using examples::language_model_loss;
using examples::Transformer;
using examples::TransformerArgs;
using examples::TransformerBlockImpl;

// Small enough for 8 ranks on 2 cores, large enough that the tensors the plan counts dwarf the
// few bytes of bookkeeping it does not (a unit is 0.75 MiB, an activation of (batch, seq, dim) 32 KiB).
TransformerArgs test_model() {
  TransformerArgs a;
  a.n_layers = 3;
  a.dim = 128;
  a.n_heads = 4;
  a.vocab_size = 512;
  a.max_seq_len = 64;
  return a;
}
constexpr int64_t kLocalBatch = 4;
constexpr int kProbes = 4;

struct Measured {
  double parameters = 0, gradients = 0, optimizer_state = 0;
  double largest_unit = 0, root_unit = 0;
  double forward_peak = 0, after_forward = 0, backward_peak = 0, activations = 0;
  double all_gather = 0, reduce_scatter = 0;
};

// A layout both ways: fully_shard's options (and whether apply_activation_checkpointing wraps the
// blocks) and the plan's.
struct Case {
  std::string label;
  FullyShardOptions options;
  bool checkpointing;
  plan::ParallelLayout layout;
  // Peaks that the comm thread's timing moves by more than 10 % between steps here (measured:
  // docs/plan.md), checked against the plan's range [low, high] instead: its benign order (the
  // comm thread keeping up) at one end, at the other the comm thread running each collective only
  // when the compute thread waits for it. With checkpointed blocks the forward holds little but
  // gathered units: a prefetched gather allocated at its wait peaks the forward a block early,
  // one unit lower (N = 8, rank 1: 2.70 MiB measured once, the range 2.70-3.33). With
  // checkpointed blocks the backward: block 1's reduce-scatter input (one unit at N = 1) alive
  // through block 0's backward when the comm thread has not yet run it (N = 1: 4.533 MiB in CI's
  // fresh clone, the range 3.779-4.533, both ends to 4 bytes). In bfloat16 at N = 2 to 4 the
  // half-precision reduce-scatter's float32 sums (1.5 MiB at N = 2) overlap the next block's
  // matmuls or not (N = 2: 3.77 to 4.41 MiB in single steps, the range 3.96-4.91); at N = 1 the
  // comm thread copies block 1's prefetched gather during block 2's backward or before it (CI's
  // Debian leg: 2.194 to 2.559 MiB, the range 2.187-2.564). What this
  // cannot show: which order a step took, nor an error in the plan smaller than the gap
  // between the ends; the lines outside these stay checked against the benign order alone.
  bool forward_peak_ranged = false;
  std::vector<int> backward_peak_ranged_at = {};  // world sizes
};

std::vector<Case> cases() {
  using plan::ParallelLayout;
  const auto bf16 = MixedPrecisionPolicy().param_dtype(at::kBFloat16);
  // Both default to BACKWARD_PRE_WITHIN_BOUND (the "default options" case), which decides from
  // the first backward; the other layouts pin BACKWARD_PRE on both sides.
  const auto pre = FullyShardOptions().backward_prefetch(BackwardPrefetch::BACKWARD_PRE);
  const auto plan_pre = ParallelLayout().backward_prefetch(plan::BackwardPrefetch::kBackwardPre);
  return {
      {"BACKWARD_PRE", pre, false, plan_pre},
      {"no backward prefetch", FullyShardOptions().backward_prefetch(std::nullopt), false,
       ParallelLayout().backward_prefetch(plan::BackwardPrefetch::kNone)},
      {"reshard_after_forward false", FullyShardOptions(pre).reshard_after_forward(false), false,
       ParallelLayout(plan_pre).reshard_after_forward(false)},
      {"bfloat16 compute", FullyShardOptions(pre).mp_policy(bf16), false,
       ParallelLayout(plan_pre).param_dtype(at::kBFloat16).reduce_dtype(at::kBFloat16), false, {1, 2, 3, 4}},
      {"activation checkpointing", pre, true, ParallelLayout(plan_pre).activation_checkpointing(true), true,
       {1, 2, 3, 4, 5, 6, 7, 8}},
      // fully_shard's default, BACKWARD_PRE_WITHIN_BOUND: the first step (measure_step's
      // warm-up) measures each unit's window without prefetch, then each unit prefetches or not.
      {"default options", FullyShardOptions(), false, ParallelLayout()},
  };
}

Measured measure_step(const Case& c, int rank) {
  const TransformerArgs args = test_model();
  torch::manual_seed(rank);
  const at::Tensor tokens = torch::randint(args.vocab_size, {kLocalBatch, args.max_seq_len}, torch::kLong);
  const at::Tensor targets = torch::randint(args.vocab_size, {kLocalBatch, args.max_seq_len}, torch::kLong);
  torch::manual_seed(0);
  FullyShardOptions options = c.options;
  auto model = fully_shard(Transformer(args), options.auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>()));
  if (c.checkpointing) apply_activation_checkpointing(*model, ModuleWrapPolicy<TransformerBlockImpl>());
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
  auto step = [&] {
    opt.zero_grad();
    language_model_loss(model->forward(tokens), targets).backward();
    opt.step();
  };
  step();  // Adam's state exists from here on
  Measured m;
  double gathered_after_forward = 0;  // the root, and every block when blocks do not reshard
  for (const auto* unit : fsdp_units(*model)) {
    const double bytes = static_cast<double>(unit->unsharded_padded_numel()) *
                         static_cast<double>(c10::elementSize(c.layout.param_dtype()));
    m.largest_unit = std::max(m.largest_unit, bytes);
    if (unit->is_root()) m.root_unit = bytes;
    if (unit->is_root() || !c.layout.reshard_after_forward()) gathered_after_forward += bytes;
  }
  for (const auto& p : model->parameters()) {
    m.parameters += static_cast<double>(p.nbytes());
    m.gradients += static_cast<double>(p.grad().nbytes());
  }
  for (const auto& [key, state] : opt.state()) {
    const auto& adam = static_cast<const torch::optim::AdamParamState&>(*state);
    m.optimizer_state += static_cast<double>(adam.exp_avg().nbytes() + adam.exp_avg_sq().nbytes());
  }
  // bench_fsdp's probe: the base is taken before zero_grad(). A step's peak moves by parts of a
  // unit with when the comm thread allocates a prefetched gather or finishes a reduce-scatter;
  // the largest of a few steps is the one the schedule reaches (docs/plan.md).
  for (int probe = 0; probe < kProbes; ++probe) {
    reset_peak_memory_stats();
    const double base = static_cast<double>(memory_stats().current_bytes);
    opt.zero_grad();
    const double without_grads = static_cast<double>(memory_stats().current_bytes);
    at::Tensor loss = language_model_loss(model->forward(tokens), targets);
    m.forward_peak = std::max(m.forward_peak, static_cast<double>(memory_stats().peak_bytes) - base);
    m.after_forward = static_cast<double>(memory_stats().current_bytes) - base;
    m.activations = static_cast<double>(memory_stats().current_bytes) - without_grads - gathered_after_forward;
    loss.backward();
    m.backward_peak = std::max(m.backward_peak, static_cast<double>(memory_stats().peak_bytes) - base);
    loss = at::Tensor();
    opt.step();
  }
  CommDebugMode comm;
  step();
  m.all_gather = static_cast<double>(comm.bytes_sent("all_gather_into_tensor"));
  m.reduce_scatter = static_cast<double>(comm.bytes_sent("reduce_scatter_tensor"));
  return m;
}

plan::StepPlan plan_for(const Case& c, int rank, int world_size) {
  const TransformerArgs a = test_model();
  plan::ParallelLayout layout = c.layout;
  return plan::plan_step(
      plan::ModelShape().layers(a.n_layers).dim(a.dim).heads(a.n_heads).vocab(a.vocab_size).seq(a.max_seq_len).batch(kLocalBatch),
      layout.world_size(world_size).rank(rank));
}

// Within 10 % of the measurement; a line near zero (the step's lines are differences from the
// held state, which at N = 1 exceeds what a step adds) within 10 % of the largest unit instead.
void expect_within_10_percent(double planned, double measured, double unit, const std::string& what) {
  const double scale = std::max(std::abs(measured), unit);
  EXPECT_LE(std::abs(planned - measured), 0.10 * scale)
      << what << ": planned " << planned / (1 << 20) << " MiB, measured " << measured / (1 << 20) << " MiB ("
      << (planned - measured) / scale * 100 << " %)";
}

// Within 10 % (as above) of the range [low, high].
void expect_within_10_percent_of_range(double low, double high, double measured, double unit, const std::string& what) {
  const double scale = std::max(std::abs(measured), unit);
  const double off = measured < low ? low - measured : measured > high ? measured - high : 0;
  EXPECT_LE(off, 0.10 * scale) << what << ": planned " << low / (1 << 20) << "-" << high / (1 << 20)
                               << " MiB, measured " << measured / (1 << 20) << " MiB (" << off / scale * 100
                               << " % outside)";
}

class PlanAgainstMeasurement : public ::testing::TestWithParam<int> {};

TEST_P(PlanAgainstMeasurement, EveryLineOfBenchFsdp) {
  testing::RunOptions options;
  options.deadline = std::chrono::seconds(240);
  options.check_collectives = false;  // as bench_fsdp runs
  testing::run_ranks(
      GetParam(),
      [](testing::RankContext& ctx) {
        for (const Case& c : cases()) {
          const std::string label =
              c.label + ", rank " + std::to_string(ctx.rank) + " of " + std::to_string(ctx.world_size);
          const Measured m = measure_step(c, ctx.rank);
          const plan::StepPlan p = plan_for(c, ctx.rank, ctx.world_size);
          EXPECT_EQ(p.parameters, m.parameters) << label;
          EXPECT_EQ(p.gradients, m.gradients) << label;
          EXPECT_EQ(p.optimizer_state, m.optimizer_state) << label;
          EXPECT_EQ(p.largest_unit, m.largest_unit) << label;
          EXPECT_EQ(p.root_unit, m.root_unit) << label;
          EXPECT_EQ(p.all_gather_bytes, m.all_gather) << label;
          EXPECT_EQ(p.reduce_scatter_bytes, m.reduce_scatter) << label;
          const double u = m.largest_unit;
          expect_within_10_percent(p.activations, m.activations, 0, label + ", activations");
          if (c.forward_peak_ranged)
            expect_within_10_percent_of_range(p.forward_peak_low, p.forward_peak_high, m.forward_peak, u,
                                              label + ", forward peak");
          else
            expect_within_10_percent(p.forward_peak, m.forward_peak, u, label + ", forward peak");
          expect_within_10_percent(p.after_forward, m.after_forward, u, label + ", held after forward");
          const auto& ranged = c.backward_peak_ranged_at;
          if (std::find(ranged.begin(), ranged.end(), ctx.world_size) != ranged.end())
            expect_within_10_percent_of_range(p.backward_peak_low, p.backward_peak_high, m.backward_peak, u,
                                              label + ", backward peak");
          else
            expect_within_10_percent(p.backward_peak, m.backward_peak, u, label + ", backward peak");
          // The numbers for docs/plan.md: FSDPP_PLAN_REPORT=FILE appends rank 0's line.
          const char* report = std::getenv("FSDPP_PLAN_REPORT");
          if (ctx.rank == 0 && report != nullptr)
            if (FILE* f = std::fopen(report, "a")) {
              std::fprintf(f, "[plan vs measured] N = %d, %s: activations %.4f / %.4f MiB, forward peak %.4f (%.4f-%.4f) / "
                        "%.4f, held after forward %.4f / %.4f, backward peak %.4f (%.4f-%.4f) / %.4f\n",
                        ctx.world_size, c.label.c_str(), p.activations / 1048576.0, m.activations / 1048576.0,
                        p.forward_peak / 1048576.0, p.forward_peak_low / 1048576.0, p.forward_peak_high / 1048576.0,
                        m.forward_peak / 1048576.0, p.after_forward / 1048576.0, m.after_forward / 1048576.0,
                        p.backward_peak / 1048576.0, p.backward_peak_low / 1048576.0,
                        p.backward_peak_high / 1048576.0, m.backward_peak / 1048576.0);
              std::fclose(f);
            }
        }
      },
      options);
}

// A model given by its parameter list (plan::units_of): a transformer whose output projection is
// tied to the token embedding (one parameter in two modules), its units' sizes, held state and
// bytes on the wire against fully_shard's.
TEST_P(PlanAgainstMeasurement, ParameterListOfATiedTransformer) {
  testing::run_ranks(GetParam(), [](testing::RankContext& ctx) {
    TransformerArgs args = test_model();
    args.weight_tying = true;
    torch::manual_seed(0);
    Transformer plain(args);
    const auto units = plan::units_of(*plain, *ModuleWrapPolicy<TransformerBlockImpl>());
    const plan::StepPlan p = plan::plan_units(units, plan::ParallelLayout().world_size(ctx.world_size).rank(ctx.rank));
    auto model = fully_shard(plain, FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>()));
    const auto fsdp = fsdp_units(*model);
    ASSERT_EQ(fsdp.size(), p.units.size());
    for (size_t i = 0; i < fsdp.size(); ++i)
      EXPECT_EQ(fsdp[i]->unsharded_padded_numel(), p.units[i].unsharded_padded_numel) << "unit " << i;
    double parameters = 0;
    std::set<const void*> seen;  // parameters() lists the tied weight under both names
    for (const auto& t : model->parameters())
      if (seen.insert(t.unsafeGetTensorImpl()).second) parameters += static_cast<double>(t.nbytes());
    EXPECT_EQ(p.parameters, parameters);
    torch::optim::SGD opt(model->parameters(), 0.1);
    const at::Tensor tokens = torch::randint(args.vocab_size, {kLocalBatch, args.max_seq_len}, torch::kLong);
    CommDebugMode comm;
    opt.zero_grad();
    language_model_loss(model->forward(tokens), tokens).backward();
    EXPECT_EQ(p.all_gather_bytes, comm.bytes_sent("all_gather_into_tensor"));
    EXPECT_EQ(p.reduce_scatter_bytes, comm.bytes_sent("reduce_scatter_tensor"));
  });
}

INSTANTIATE_TEST_SUITE_P(, PlanAgainstMeasurement, ::testing::Range(1, 9), testing::world_size_name);

}  // namespace
}  // namespace fsdpp

// fsdpp-plan's counts that need no run (include/fsdpp/plan.h): each against a count written out
// here by hand. PlanAgainstMeasurement (tests/dist/test_plan.cpp) checks the rest against FSDP.
#include <gtest/gtest.h>

#include <fsdpp/deferred_init.h>
#include <fsdpp/error.h>
#include <fsdpp/plan.h>
#include <fsdpp/wrap_policy.h>

#include "plan/transformer_tape.h"
#include "plan/unit_shapes.h"
#include "transformer.h"

namespace fsdpp::plan {
namespace {

// bench_fsdp's transformer: 4 layers, dim 256, 4 heads, vocab 1024, seq 32, 2 sequences.
const ModelShape kBench;

TEST(PlanFormulas, TapeMakesEachUnitsGradientsOnce) {
  for (const ModelShape& m : {kBench, ModelShape(kBench).tied_embeddings(true),
                              ModelShape::llama(2, 256, 8, 2, 512, 1000).seq(16).batch(1)})
    for (int64_t tp : {1, 2}) {
      if (m.tied_embeddings() && tp > 1) continue;
      const auto params = detail::unit_params(m, tp);
      std::vector<int64_t> from_tape(params.size(), 0);
      const detail::Tape tape = detail::transformer_tape(m, tp, 2);
      for (const auto& op : tape.ops())
        if (op.param_grad_bytes > 0 && !op.param_grad_accumulates) from_tape[op.unit] += op.param_grad_bytes;
      for (size_t u = 0; u < params.size(); ++u) {
        int64_t numel = 0;
        for (const auto& p : params[u]) numel += p.numel();
        EXPECT_EQ(from_tape[u], 2 * numel) << "unit " << u << ", tp " << tp;
      }
    }
}

TEST(PlanFormulas, ShardsAsTorchChunkWithPadding) {
  // pos_embeddings has 32 rows: at N = 3 chunks of 11, rank 2 holds 10.
  const std::vector<detail::ParamShape> params{{"pos", 32, 256}, {"bias", 5, 1}};
  const UnitPlan r0 = detail::shard_unit("u", params, 3, 0), r2 = detail::shard_unit("u", params, 3, 2);
  EXPECT_EQ(r0.shard_padded_numel, 11 * 256 + 2);
  EXPECT_EQ(r0.unsharded_padded_numel, 3 * (11 * 256 + 2));
  EXPECT_EQ(r0.local_numel, 11 * 256 + 2);
  EXPECT_EQ(r2.local_numel, 10 * 256 + 1);
}

TEST(PlanFormulas, WireBytesAreDesignMdsBound) {
  for (int64_t n : {2, 3, 4, 8}) {
    const StepPlan p = plan_step(kBench, ParallelLayout().world_size(n));
    // A block: 12 d^2 + 9 d elements; the root: tok and output (1024 x 256), pos (32 x 256), norm (2 x 256).
    const int64_t d = 256;
    auto padded = [&](int64_t rows, int64_t row) { return (rows + n - 1) / n * row * n; };
    const int64_t block = 2 * padded(d, 1) + 3 * padded(d, d) + padded(d, d) + 2 * padded(d, 1) + padded(4 * d, d) +
                          padded(4 * d, 1) + padded(d, 4 * d) + padded(d, 1);
    const int64_t root = 2 * padded(1024, d) + padded(32, d) + 2 * padded(d, 1);
    // all-gather: every unit in forward, blocks again in backward; reduce-scatter: once each.
    EXPECT_EQ(p.all_gather_bytes, (n - 1) * 4 * (root + 2 * 4 * block) / n) << n;
    EXPECT_EQ(p.reduce_scatter_bytes, (n - 1) * 4 * (root + 4 * block) / n) << n;
    EXPECT_EQ(p.largest_unit, 4 * block);
    EXPECT_EQ(p.root_unit, 4 * root);
  }
  // No reshard after forward: no backward all-gather.
  const StepPlan keep = plan_step(kBench, ParallelLayout().world_size(4).reshard_after_forward(false));
  const StepPlan reshard = plan_step(kBench, ParallelLayout().world_size(4));
  EXPECT_EQ(keep.all_gather_bytes, reshard.reduce_scatter_bytes);
  // bfloat16 compute halves the gathers and the gathered units; a float32 reduce keeps its bytes.
  const StepPlan bf16 = plan_step(kBench, ParallelLayout().world_size(4).param_dtype(at::kBFloat16));
  EXPECT_EQ(2 * bf16.all_gather_bytes, reshard.all_gather_bytes);
  EXPECT_EQ(bf16.reduce_scatter_bytes, reshard.reduce_scatter_bytes);
  EXPECT_EQ(2 * bf16.largest_unit, reshard.largest_unit);
}

TEST(PlanFormulas, HsdpShardsWithinAGroupAndAllReducesAcross) {
  const StepPlan fsdp4 = plan_step(kBench, ParallelLayout().world_size(4));
  const StepPlan hsdp = plan_step(kBench, ParallelLayout().world_size(8).replicate(2));
  EXPECT_EQ(hsdp.shard_group_size, 4);
  EXPECT_EQ(hsdp.parameters, fsdp4.parameters);
  EXPECT_EQ(hsdp.all_gather_bytes, fsdp4.all_gather_bytes);
  // Ring all-reduce over 2 replicas of each padded shard: 2 (R - 1) / R = 1 shard's bytes.
  int64_t shards = 0;
  for (const auto& u : hsdp.units) shards += u.shard_padded_numel * 4;
  EXPECT_EQ(hsdp.replicate_all_reduce_bytes, shards);
  EXPECT_EQ(fsdp4.replicate_all_reduce_bytes, 0);
}

TEST(PlanFormulas, CheckpointedBlocksSaveOnlyTheirInputs) {
  // Left after forward with every block checkpointed: the positions (32 longs), the embeddings'
  // sum and each block's output (the next block's or the final norm's input), the final norm's
  // output and its mean and rstd, log_softmax's output, the loss and nll's total_weight.
  const int64_t t = 2 * 32, td = t * 256 * 4;
  const StepPlan p = plan_step(kBench, ParallelLayout().world_size(2).activation_checkpointing(true));
  // ... and each checkpoint the CPU generator's state (5056 bytes).
  EXPECT_EQ(p.activations, 32 * 8 + (1 + 4) * td + td + 2 * t * 4 + t * 1024 * 4 + 4 + 4 + 4 * 5056);
  // Under the same prefetch (BACKWARD_PRE) checkpointing lowers the backward peak.
  const auto pre = ParallelLayout().world_size(2).backward_prefetch(BackwardPrefetch::kBackwardPre);
  EXPECT_LT(plan_step(kBench, ParallelLayout(pre).activation_checkpointing(true)).backward_peak,
            plan_step(kBench, pre).backward_peak);
}

TEST(PlanFormulas, OffloadKeepsStateOnTheHost) {
  const StepPlan on_device = plan_step(kBench, ParallelLayout().world_size(4));
  const StepPlan offloaded = plan_step(kBench, ParallelLayout().world_size(4).cpu_offload(true));
  EXPECT_EQ(offloaded.parameters + offloaded.gradients + offloaded.optimizer_state, 0);
  EXPECT_EQ(offloaded.host_parameters, on_device.parameters);
  EXPECT_EQ(offloaded.host_optimizer_state, 2 * on_device.parameters);
  EXPECT_EQ(offloaded.held, 0);
}

TEST(PlanFormulas, BoundedPrefetchNeverAboveBackwardPre) {
  for (int64_t n : {1, 2, 4, 8}) {
    const auto peak = [&](BackwardPrefetch b) {
      return plan_step(kBench, ParallelLayout().world_size(n).backward_prefetch(b)).backward_peak;
    };
    EXPECT_LE(peak(BackwardPrefetch::kBounded), peak(BackwardPrefetch::kBackwardPre)) << n;
    EXPECT_LE(peak(BackwardPrefetch::kNone), peak(BackwardPrefetch::kBackwardPre)) << n;
  }
}

TEST(PlanFormulas, SlowCommThreadHoldsOneReduceScatterInputMore) {
  // Every block checkpointed, one rank, BACKWARD_PRE: block 0's backward prefetches nothing, so
  // when the comm thread has not yet run block 1's reduce-scatter (a copy), its input (the
  // unit's gradients in float32, one gathered unit) is alive at block 0's peak; the benign
  // order's peak is the low end, and the forward's high end is the benign one.
  const StepPlan p = plan_step(ModelShape().layers(3).dim(128).vocab(512).seq(64).batch(4),
                               ParallelLayout().activation_checkpointing(true).backward_prefetch(BackwardPrefetch::kBackwardPre));
  EXPECT_EQ(p.backward_peak_low, p.backward_peak);
  EXPECT_EQ(p.backward_peak_high, p.backward_peak + p.largest_unit);
  EXPECT_EQ(p.forward_peak_high, p.forward_peak);
  EXPECT_LT(p.forward_peak_low, p.forward_peak);
  EXPECT_EQ(p.step_peak_high, p.held + p.backward_peak_high);
}

TEST(PlanFormulas, QueuedGatherRunAtThePeakIsTheHighEnd) {
  // bfloat16, one rank, BACKWARD_PRE: block 2's pre-backward queues block 1's gather, whose input
  // (the shard cast to bfloat16, one gathered unit at N = 1) lives until the comm thread copies
  // it into the output; run at block 2's peak (measured: CI once), both are alive there.
  const StepPlan p = plan_step(ModelShape().layers(3).dim(128).heads(4).vocab(512).seq(64).batch(4),
                               ParallelLayout().param_dtype(at::kBFloat16).reduce_dtype(at::kBFloat16).backward_prefetch(BackwardPrefetch::kBackwardPre));
  EXPECT_EQ(p.backward_peak_low, 2293508);  // the slow order's, the gather's input alive at it
  EXPECT_EQ(p.backward_peak_high, p.backward_peak_low + p.largest_unit);
}

TEST(PlanFormulas, LargestFittingModelFitsAndOneMoreLayerDoesNot) {
  const ModelShape m = ModelShape::llama(80, 8192, 64, 8, 28672, 128256).seq(8192).batch(1);
  const ParallelLayout l =
      ParallelLayout().world_size(64).param_dtype(at::kBFloat16).activation_checkpointing(true);
  const int64_t limit = 80LL << 30;
  const int64_t layers = largest_fitting_layers(m, l, limit);
  ASSERT_GT(layers, 0);
  // Fitting is in either order of the comm thread: its high end.
  EXPECT_LE(plan_step(ModelShape(m).layers(layers), l).step_peak_high, limit);
  EXPECT_GT(plan_step(ModelShape(m).layers(layers + 1), l).step_peak_high, limit);
}

// The parameter list of the module itself, cut as ModuleWrapPolicy<Block> cuts it, plans the same
// state and traffic as the shape description: at bench_fsdp's size built normally, and at a 64 B
// parameter size built under deferred_init (meta tensors: shapes, no memory).
TEST(PlanFormulas, ModuleParameterListPlansAsTheShape) {
  auto check = [](const examples::Transformer& model, const ModelShape& shape) {
    const auto units = units_of(*model, *ModuleWrapPolicy<examples::TransformerBlockImpl>());
    ASSERT_EQ(units.size(), static_cast<size_t>(1 + shape.layers()));
    EXPECT_EQ(units[0].shapes.size(), 5u);  // tok, pos, norm weight and bias, output
    EXPECT_EQ(units[1].shapes.size(), 12u);
    for (int64_t n : {1, 3, 8, 4096}) {
      const auto layout = ParallelLayout().world_size(n);
      const StepPlan from_module = plan_units(units, layout), from_shape = plan_step(shape, layout);
      for (int64_t StepPlan::*line : {&StepPlan::parameters, &StepPlan::optimizer_state, &StepPlan::held,
                                      &StepPlan::largest_unit, &StepPlan::root_unit, &StepPlan::all_gather_bytes,
                                      &StepPlan::reduce_scatter_bytes})
        EXPECT_EQ(from_module.*line, from_shape.*line) << n;
    }
  };
  auto args_of = [](const ModelShape& m) {
    examples::TransformerArgs a;
    a.n_layers = m.layers();
    a.dim = m.dim();
    a.vocab_size = m.vocab();
    a.max_seq_len = m.seq();
    a.n_heads = m.heads();
    return a;
  };
  check(examples::Transformer(args_of(kBench)), kBench);
  const ModelShape large = ModelShape().layers(80).dim(8192).heads(64).vocab(128256).seq(8192);
  check(deferred_init([&] { return examples::Transformer(args_of(large)); }), large);
  EXPECT_GT(total_parameters(large), 64'000'000'000);
  const auto units = units_of(*examples::Transformer(args_of(kBench)), *ModuleWrapPolicy<examples::TransformerBlockImpl>());
  EXPECT_THROW(plan_units(units, ParallelLayout().world_size(4).tensor_parallel(2)), Error);
}

TEST(PlanFormulas, MisuseNamesTheValue) {
  auto message = [](const ModelShape& m, const ParallelLayout& l) {
    try {
      plan_step(m, l);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(ModelShape().heads(3), ParallelLayout()).find("heads 3 must divide dim 256"), std::string::npos);
  EXPECT_NE(message(kBench, ParallelLayout().world_size(6).replicate(4)).find("must divide world_size 6"),
            std::string::npos);
  EXPECT_NE(message(kBench, ParallelLayout().world_size(4).rank(4)).find("rank 4"), std::string::npos);
}

}  // namespace
}  // namespace fsdpp::plan

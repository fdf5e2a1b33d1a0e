// FSDP (fsdpp::FullyShardedDataParallel) at world sizes 1-4, ported from seed 001
// (PyTorch's test_fully_shard_training.py). The reference is single-process training of the
// same initial model on the whole global batch, computed on every rank; each FSDP rank trains
// on its slice of that batch with a mean loss, so the group-averaged gradient equals the
// reference's gradient of the global mean.
//
// Tolerance: float32 with rtol 1.3e-6, atol 1e-5 (torch.testing's float32 defaults, which the
// seed's assertEqual uses). FSDP sums the per-sample gradients in a different order (per-rank
// means, then the reduce-scatter's average), so results differ from the reference by float32
// rounding (~1e-7 relative per step), not bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/memory.h>
#include <fsdpp/profiler.h>

#include "comm/shm_transport.h"
#include "dist/fsdp_test_util.h"
#include "dist/profiler_trace.h"
#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

// ---------------------------------------------------------------------------------------------
// TestFullyShard1DTrainingCore

class FullyShard1DTrainingCore : public testing::WorldSizeTest {};

TEST_P(FullyShard1DTrainingCore, TrainParitySingleGroup) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const Shapes& shapes : {Shapes{{16, 15}, {15, 8}}, Shapes{{7, 15}, {15, 3}}})
      for (Optim optim : {Optim::kSGD, Optim::kAdam})
        for (bool reshard_after_forward : {true, false}) {
          torch::manual_seed(42);
          Sequential ref = make_mlp(shapes);
          torch::manual_seed(42);
          FSDPSequential model(make_mlp(shapes), FullyShardOptions().reshard_after_forward(reshard_after_forward));
          ParityCase c;
          c.optim = optim;
          const std::string label = "lin (" + std::to_string(shapes[0].first) + ", " +
                                    std::to_string(shapes[0].second) + ") raf " + std::to_string(reshard_after_forward);
          check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                             [&](const at::Tensor& x) { return model->forward(x); }, shapes[0].first, shapes[1].second, c, label);
          EXPECT_TRUE(model->is_root());
          if (::testing::Test::HasFailure()) return;
        }
  });
}

// A forward under NoGradGuard between steps (an evaluation) leaves every unit sharded, so the
// optimizer's zero_grad reaches every sharded `.grad`: before the fix the root (and units with
// reshard_after_forward false) stayed unsharded with their gradient stashed, and the stale
// gradient was added to the next step's.
TEST_P(FullyShard1DTrainingCore, TrainParityWithEvalForwardBetweenSteps) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (auto& [options, name] : reshard_after_forward_sweep(ctx.world_size))
      for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
        ParityCase c;
        c.optim = optim;
        c.steps = 4;
        c.eval_forward_between_steps = true;
        check_multi_group_parity(ctx, options, c, "eval between steps, " + name);
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Seed 001 test_train_parity_multi_group: reshard_after_forward True / False / 2 (2 where it
// divides the group) x the four delay flags swept independently (the seed's 16 combinations)
// with Adam, as the seed (10 steps without delays, 4 with); and SGD without delays.
TEST_P(FullyShard1DTrainingCore, TrainParityMultiGroup) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const auto& [options, raf] : reshard_after_forward_sweep(ctx.world_size))
      for (int mask = -1; mask < 16; ++mask) {  // -1: SGD, no delays
        const ParityCase c = ParityCase::for_delay_mask(mask);
        FSDPSequential model = check_multi_group_parity(ctx, options, c, raf + " " + c.delays_name());
        auto units = fsdp_units(*model);
        ASSERT_EQ(units.size(), 3u);
        EXPECT_TRUE(units[0]->is_root());
        EXPECT_FALSE(units[1]->is_root());
        EXPECT_FALSE(units[2]->is_root());
        // The root shards only what no inner unit owns: the last Linear.
        EXPECT_EQ(units[0]->sharded_parameter_names(), (std::vector<std::string>{"4.weight", "4.bias"}));
        EXPECT_EQ(units[1]->sharded_parameter_names(), (std::vector<std::string>{"weight", "bias"}));
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Collectives per training step, counted by CommDebugMode: one all-gather per unit in
// forward, one more in backward for each non-root unit that resharded after forward, one
// reduce-scatter per unit; each moves (N - 1) / N of the unit's padded flat size.
TEST_P(FullyShard1DTrainingCore, CommCountsAndBytesPerStep) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int64_t n = ctx.world_size;
    for (bool reshard_after_forward : {true, false}) {
      const auto options = FullyShardOptions().reshard_after_forward(reshard_after_forward);
      torch::manual_seed(42);
      FSDPSequential model(make_multi_group(true, options), options);
      torch::optim::SGD opt(model->parameters(), 0.01);
      auto units = fsdp_units(*model);
      ASSERT_EQ(units.size(), 3u);
      int64_t root_numel = units[0]->unsharded_padded_numel();
      int64_t inner_numel = units[1]->unsharded_padded_numel() + units[2]->unsharded_padded_numel();
      // Padded sizes: Linear(7, 15) has 15 x 7 + 15 elements, rows padded to a multiple of n.
      auto padded = [n](int64_t rows, int64_t cols) { return (rows + n - 1) / n * n * cols; };
      EXPECT_EQ(units[1]->unsharded_padded_numel(), padded(15, 7) + padded(15, 1));
      EXPECT_EQ(root_numel, padded(3, 15) + padded(3, 1));
      for (int step = 0; step < 3; ++step) {
        torch::manual_seed(step);
        at::Tensor x = torch::randn({4, 7});
        CommDebugMode comm;
        at::Tensor loss = model->forward(x).sum();
        EXPECT_EQ(comm.count("all_gather_into_tensor"), 3) << "forward, raf " << reshard_after_forward;
        EXPECT_EQ(comm.count("reduce_scatter_tensor"), 0);
        loss.backward();
        opt.step();
        opt.zero_grad();
        const int64_t gathers = reshard_after_forward ? 5 : 3;
        EXPECT_EQ(comm.count("all_gather_into_tensor"), gathers) << "raf " << reshard_after_forward;
        EXPECT_EQ(comm.count("reduce_scatter_tensor"), 3);
        EXPECT_EQ(comm.get_total_counts(), gathers + 3) << "no other collective";
        const int64_t gathered = root_numel + inner_numel * (reshard_after_forward ? 2 : 1);
        EXPECT_EQ(comm.bytes_sent("all_gather_into_tensor"), gathered * (n - 1) / n * 4);
        EXPECT_EQ(comm.bytes_sent("reduce_scatter_tensor"), (root_numel + inner_numel) * (n - 1) / n * 4);
      }
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShard1DTrainingCore);

// ---------------------------------------------------------------------------------------------
// TestFullyShardRegisteredParams: shards at rest, full tensors after a forward that keeps them.

class FullyShardRegisteredParams : public testing::WorldSizeTest {};

void expect_sharded(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& ref, int rank, int n,
                    const std::string& what) {
  ASSERT_EQ(params.size(), ref.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor expected = shard_rows(ref[i], rank, n);
    ASSERT_EQ(params[i].sizes(), expected.sizes()) << what << " param " << i;
    EXPECT_TRUE(at::equal(params[i].detach(), expected.detach())) << what << " param " << i;
  }
}

void expect_full(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& ref, const std::string& what) {
  ASSERT_EQ(params.size(), ref.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_EQ(params[i].sizes(), ref[i].sizes()) << what << " param " << i;
    EXPECT_TRUE(at::equal(params[i].detach(), ref[i].detach())) << what << " param " << i;
  }
}

// Seed 001 test_param_registration_after_forward, reshard_after_forward True / False / 2: shards at
// rest; after forward the root's parameters are full tensors (the root never reshards after
// forward) and the inner units' are full with False and shards with True and with 2 (as FSDP2's
// registered DTensors; the 2-way copy for backward is kept aside); an explicit reshard makes
// every parameter its shard again, values unchanged throughout.
TEST_P(FullyShardRegisteredParams, ParamRegistrationAfterForward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const Shapes shapes{{3, 7}, {7, 3}};
    for (const auto& [options, raf] : reshard_after_forward_sweep(n)) {
      // Single group: the root keeps its parameters unsharded after forward.
      torch::manual_seed(42);
      Sequential ref = make_mlp(shapes);
      torch::manual_seed(42);
      FSDPSequential model(make_mlp(shapes), options);
      // The same TensorImpls as the wrapped module's own parameters.
      EXPECT_TRUE(model->parameters()[0].is_same(model->module()->parameters()[0]));
      expect_sharded(model->parameters(), ref->parameters(), rank, n, raf + " at rest");
      at::Tensor inp = torch::randn({2, 3});
      model->forward(inp);
      expect_full(model->parameters(), ref->parameters(), raf + " after forward");
      model->reshard();
      expect_sharded(model->parameters(), ref->parameters(), rank, n, raf + " after reshard");

      // Multiple groups: inner units follow reshard_after_forward, the root does not.
      torch::manual_seed(42);
      Sequential ref2 = make_multi_group(false, {});
      torch::manual_seed(42);
      FSDPSequential model2(make_multi_group(true, options), options);
      expect_sharded(model2->parameters(), ref2->parameters(), rank, n, raf + " multi at rest");
      model2->forward(torch::randn({2, 7}));
      auto params = model2->parameters();
      auto ref_params = ref2->parameters();
      std::vector<at::Tensor> inner(params.begin(), params.begin() + 4), root(params.begin() + 4, params.end());
      std::vector<at::Tensor> ref_inner(ref_params.begin(), ref_params.begin() + 4),
          ref_root(ref_params.begin() + 4, ref_params.end());
      expect_full(root, ref_root, raf + " multi root after forward");
      if (raf == "raf F")
        expect_full(inner, ref_inner, raf + " multi inner after forward");
      else  // with 2 the registered parameter is the shard too (the 2-way copy is kept aside)
        expect_sharded(inner, ref_inner, rank, n, raf + " multi inner after forward");
      for (auto* u : fsdp_units(*model2)) u->reshard();
      expect_sharded(model2->parameters(), ref2->parameters(), rank, n, raf + " multi after reshard");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// Seed 001 test_param_registration_after_backward: after backward every parameter is its shard
// again (values unchanged) with a shard-shaped gradient, for the root-only model (one unit, which
// did not reshard after its forward) and for multiple groups; reshard_after_forward True / False / 2.
TEST_P(FullyShardRegisteredParams, ParamRegistrationAfterBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    for (const auto& [options, raf] : reshard_after_forward_sweep(n)) {
      // Single group (root only).
      const Shapes shapes{{8, 7}, {7, 8}};
      torch::manual_seed(42);
      Sequential ref1 = make_mlp(shapes);
      torch::manual_seed(42);
      FSDPSequential root_only(make_mlp(shapes), options);
      expect_sharded(root_only->parameters(), ref1->parameters(), rank, n, raf + " root only at rest");
      root_only->forward(torch::randn({2, 8}));
      expect_full(root_only->parameters(), ref1->parameters(), raf + " root only after forward");
      root_only->forward(torch::randn({2, 8})).sum().backward();
      expect_sharded(root_only->parameters(), ref1->parameters(), rank, n, raf + " root only after backward");
      auto params1 = root_only->parameters();
      auto ref_params1 = ref1->parameters();
      for (size_t i = 0; i < params1.size(); ++i) {
        ASSERT_TRUE(params1[i].grad().defined()) << "root only " << i;
        EXPECT_EQ(params1[i].grad().sizes(), shard_rows(ref_params1[i], rank, n).sizes()) << "root only " << i;
      }

      // Multiple groups.
      torch::manual_seed(42);
      Sequential ref = make_multi_group(false, {});
      torch::manual_seed(42);
      FSDPSequential model(make_multi_group(true, options), options);
      model->forward(torch::randn({2, 7})).sum().backward();
      expect_sharded(model->parameters(), ref->parameters(), rank, n, raf + " after backward");
      auto params = model->parameters();
      auto ref_params = ref->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        ASSERT_TRUE(params[i].grad().defined()) << raf << " " << i;
        EXPECT_EQ(params[i].grad().sizes(), shard_rows(ref_params[i], rank, n).sizes()) << raf << " " << i;
      }
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardRegisteredParams);

// ---------------------------------------------------------------------------------------------
// TestFullyShardGradientAccumulation (the part that needs no extra API): a backward without
// zeroing adds the new reduced gradient to the shard already in `.grad`.

TEST_P(FullyShardGradientAccumulation, AccumulatesIntoUnzeroedGrad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    for (bool reshard_after_forward : {true, false}) {
      const auto options = FullyShardOptions().reshard_after_forward(reshard_after_forward);
      torch::manual_seed(42);
      Sequential ref = make_multi_group(false, options);
      torch::manual_seed(42);
      FSDPSequential model(make_multi_group(true, options), options);
      for (int micro = 0; micro < 3; ++micro) {
        torch::manual_seed(7 + micro);
        at::Tensor x = torch::randn({kGlobalBatch, 7});
        ref->forward(x).pow(2).mean().backward();
        model->forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
        auto params = model->parameters();
        auto ref_params = ref->parameters();
        for (size_t i = 0; i < params.size(); ++i)
          expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n),
                       "micro-batch " + std::to_string(micro) + " grad " + std::to_string(i));
      }
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardGradientAccumulation);

// Seed 001 test_gradient_accumulation (its body is a stub; the scenario its parameters name, as
// PyTorch's full test runs it): a root holding Linear(8, 8) and three MLP units; each iteration
// runs 3 microbatches and only the last syncs gradients, for the units the mode picks:
//   all        set_requires_gradient_sync(last) on the root, recursively;
//   root_only  on the root only (recurse = false): the MLPs reduce every microbatch;
//   some_mlps  on the first two MLPs: the third MLP and the root reduce every microbatch;
// with reshard_after_backward = false, the same units also keep their parameters gathered
// between microbatches (set_reshard_after_backward(last)). Swept: mode x reshard_after_forward
// True / False / 2 (even world sizes) x reshard_after_backward F/T, and CPUOffloadPolicy for
// reshard_after_forward True. Per microbatch the losses match the plain model's on the global
// batch; per iteration the all-gathers and reduce-scatters are counted (derived unit by unit
// from the flags below) and, after the last microbatch, every gradient shard equals the plain
// model's accumulated gradient; then both step (Adam) and the parameters agree.
enum class AccumulationMode { kAll, kRootOnly, kSomeMlps };

TEST_P(FullyShardGradientAccumulation, GradientAccumulation) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    constexpr int kMlps = 3, kMicrobatches = 3, kIterations = 3, kDisabledMlps = 2;
    auto make = [](bool wrap, const FullyShardOptions& options) {
      torch::manual_seed(42);
      Sequential s(Linear(8, 8));
      for (int i = 0; i < kMlps; ++i) {
        MLP mlp(8, 16);
        if (wrap)
          s->push_back(FullyShardedDataParallel<MLPImpl>(mlp, options));
        else
          s->push_back(mlp);
      }
      return s;
    };
    struct Case {
      FullyShardOptions options;
      std::string name;
    };
    std::vector<Case> cases;
    for (const auto& [options, raf] : reshard_after_forward_sweep(n)) cases.push_back({options, raf});
    cases.push_back({FullyShardOptions().reshard_after_forward(true).offload_policy(CPUOffloadPolicy()), "raf T offload"});
    for (const Case& c : cases)
      for (AccumulationMode mode : {AccumulationMode::kAll, AccumulationMode::kRootOnly, AccumulationMode::kSomeMlps})
        for (bool reshard_after_backward : {false, true}) {
          const std::string label = c.name + (mode == AccumulationMode::kAll        ? " all"
                                              : mode == AccumulationMode::kRootOnly ? " root_only"
                                                                                    : " some_mlps") +
                                    " rab " + (reshard_after_backward ? "T" : "F");
          const bool raf_reshards = c.name != "raf F";
          Sequential ref = make(false, {});
          FSDPSequential model(make(true, c.options), c.options);
          auto units = fsdp_units(*model);  // the root, then the MLPs in order
          ASSERT_EQ(units.size(), 1u + kMlps);
          auto ref_opt = make_optimizer(Optim::kAdam, ref->parameters());
          auto opt = make_optimizer(Optim::kAdam, model->parameters());
          // The units whose gradient sync (and, without reshard_after_backward, resharding after
          // backward) waits for the last microbatch.
          std::vector<bool> waits(units.size(), false);
          for (size_t u = 0; u < units.size(); ++u)
            waits[u] = mode == AccumulationMode::kAll || (mode == AccumulationMode::kRootOnly && u == 0) ||
                       (mode == AccumulationMode::kSomeMlps && u >= 1 && u <= kDisabledMlps);
          for (int iter = 0; iter < kIterations; ++iter) {
            const std::string where = label + " iteration " + std::to_string(iter);
            int64_t expected_gathers = 0, expected_reduce_scatters = 0;
            std::vector<bool> sharded(units.size(), true);  // every unit is sharded at an iteration's start
            CommDebugMode comm;
            for (int micro = 0; micro < kMicrobatches; ++micro) {
              const bool last = micro == kMicrobatches - 1;
              switch (mode) {
                case AccumulationMode::kAll:
                  model->set_requires_gradient_sync(last);
                  if (!reshard_after_backward) model->set_reshard_after_backward(last);
                  break;
                case AccumulationMode::kRootOnly:
                  model->set_requires_gradient_sync(last, /*recurse=*/false);
                  if (!reshard_after_backward) model->set_reshard_after_backward(last, /*recurse=*/false);
                  break;
                case AccumulationMode::kSomeMlps:
                  for (int u = 1; u <= kDisabledMlps; ++u) {
                    units[u]->set_requires_gradient_sync(last);
                    if (!reshard_after_backward) units[u]->set_reshard_after_backward(last);
                  }
                  break;
              }
              for (size_t u = 0; u < units.size(); ++u) {
                const bool syncs = !waits[u] || last;
                expected_gathers += sharded[u];                 // forward gathers a sharded unit
                expected_gathers += u > 0 && raf_reshards;      // backward re-gathers what forward freed (never the root)
                expected_reduce_scatters += syncs;
                sharded[u] = syncs || reshard_after_backward;  // a syncing backward always reshards
              }
              torch::manual_seed(100 * iter + micro);
              at::Tensor x = torch::randn({kGlobalBatch, 8});
              at::Tensor ref_loss = ref->forward(x).pow(2).mean();
              ref_loss.backward();
              at::Tensor loss = model->forward(x.narrow(0, rank * local, local)).pow(2).mean();
              loss.backward();
              at::Tensor global_loss = loss.detach().clone();
              all_reduce(global_loss, ReduceOp::AVG);
              expect_close(global_loss, ref_loss.detach(), where + " micro " + std::to_string(micro) + " loss");
            }
            EXPECT_EQ(comm.count("all_gather_into_tensor"), expected_gathers) << where;
            EXPECT_EQ(comm.count("reduce_scatter_tensor"), expected_reduce_scatters) << where;
            auto params = model->parameters();
            auto ref_params = ref->parameters();
            ASSERT_EQ(params.size(), ref_params.size());
            for (size_t i = 0; i < params.size(); ++i) {
              ASSERT_EQ(params[i].sizes(), shard_rows(ref_params[i], rank, n).sizes()) << where << " param " << i;
              expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n), where + " grad " + std::to_string(i));
            }
            ref_opt->step();
            opt->step();
            auto full = full_params(*model);
            for (size_t i = 0; i < full.size(); ++i)
              expect_close(full[i], ref_params[i].detach(), where + " param " + std::to_string(i));
            ref_opt->zero_grad();
            opt->zero_grad();
            if (::testing::Test::HasFailure()) return;
          }
        }
  });
}

// Microbatches without sync and without resharding after backward: only the first
// microbatch gathers; the last one (sync on, reshard on) reduce-scatters the sum and reshards.
TEST_P(FullyShardGradientAccumulation, NoSyncNoReshardAfterBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    const auto options = FullyShardOptions().reshard_after_forward(false);
    torch::manual_seed(42);
    Sequential ref = make_multi_group(false, options);
    torch::manual_seed(42);
    FSDPSequential model(make_multi_group(true, options), options);
    const int microbatches = 4;
    for (int micro = 0; micro < microbatches; ++micro) {
      const bool last = micro == microbatches - 1;
      model->set_requires_gradient_sync(last);
      model->set_reshard_after_backward(last);
      torch::manual_seed(micro);
      at::Tensor x = torch::randn({kGlobalBatch, 7});
      ref->forward(x).pow(2).mean().backward();
      CommDebugMode comm;
      model->forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
      EXPECT_EQ(comm.count("all_gather_into_tensor"), micro == 0 ? 3 : 0) << "micro " << micro;
      EXPECT_EQ(comm.count("reduce_scatter_tensor"), last ? 3 : 0) << "micro " << micro;
      auto params = model->parameters();
      auto ref_params = ref->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        if (last) {
          ASSERT_EQ(params[i].sizes(), shard_rows(ref_params[i], rank, n).sizes()) << "resharded at the end";
          expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n), "grad " + std::to_string(i));
        } else {
          EXPECT_EQ(params[i].sizes(), ref_params[i].sizes()) << "kept unsharded, micro " << micro;
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Non-root forward/backward and a unit used twice in one forward (seed 001's
// test_non_root_forward_backward and test_multi_forward_module).

TEST_P(FullyShard1DTrainingCore, NonRootForwardBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    auto make = [](bool wrap) {
      torch::manual_seed(42);
      Sequential seq;
      for (int i = 0; i < 3; ++i) {
        MLP mlp(5, 9);
        if (wrap)
          seq->push_back(FullyShardedDataParallel<MLPImpl>(mlp));
        else
          seq->push_back(mlp);
      }
      return seq;
    };
    Sequential ref = make(false);
    FSDPSequential model(make(true));
    torch::optim::Adam ref_opt(ref->parameters(), 1e-2), opt(model->parameters(), 1e-2);
    torch::manual_seed(3);
    at::Tensor x = torch::randn({kGlobalBatch, 5});
    at::Tensor xs = x.narrow(0, rank * local, local);

    at::Tensor ref_root_loss = ref->forward(x).pow(2).mean();
    ref_root_loss.backward();
    ref_opt.step();
    ref_opt.zero_grad();
    at::Tensor root_loss = model->forward(xs).pow(2).mean();
    root_loss.backward();
    opt.step();
    opt.zero_grad();

    auto inner0 = std::dynamic_pointer_cast<FullyShardedDataParallelImpl<MLPImpl>>(model->module()->ptr(0));
    ASSERT_TRUE(inner0);
    EXPECT_FALSE(inner0->is_root());
    at::Tensor ref_nonroot_loss = ref[0]->as<MLPImpl>()->forward(x).pow(2).mean();
    ref_nonroot_loss.backward();
    ref_opt.step();
    CommDebugMode comm;
    at::Tensor nonroot_loss = inner0->forward(xs).pow(2).mean();
    nonroot_loss.backward();
    EXPECT_EQ(comm.count("reduce_scatter_tensor"), 1) << "only the non-root unit reduces";
    opt.step();

    for (auto [loss, ref_loss] : {std::pair{root_loss, ref_root_loss}, std::pair{nonroot_loss, ref_nonroot_loss}}) {
      at::Tensor global = loss.detach().clone();
      all_reduce(global, ReduceOp::AVG);
      expect_close(global, ref_loss.detach(), "loss");
    }
    auto full = full_params(*model);
    auto ref_params = ref->parameters();
    for (size_t i = 0; i < full.size(); ++i) expect_close(full[i], ref_params[i].detach(), "param " + std::to_string(i));
  });
}

struct MultiForwardImpl : torch::nn::Module {
  MultiForwardImpl(bool wrap, const FullyShardOptions& options) {
    Linear l1(7, 9);
    inner = wrap ? torch::nn::AnyModule(FSDPLinear(l1, options)) : torch::nn::AnyModule(l1);
    register_module("inner", inner.ptr());
    out = register_module("out", Linear(9, 3));
  }
  // The inner unit runs twice in one forward.
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor a = inner.forward(x);
    at::Tensor b = inner.forward(x * 2);
    return out->forward(torch::relu(a) + b);
  }
  torch::nn::AnyModule inner;
  Linear out{nullptr};
};
TORCH_MODULE(MultiForward);

// Seed 001 test_multi_forward_module: a unit run twice in one forward trains at parity with the
// plain model, reshard_after_forward True / False / 2 as the seed.
TEST_P(FullyShard1DTrainingCore, MultiForwardModule) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const auto& [options, raf] : reshard_after_forward_sweep(ctx.world_size)) {
      torch::manual_seed(42);
      MultiForward ref(false, options);
      torch::manual_seed(42);
      FullyShardedDataParallel<MultiForwardImpl> model(MultiForward(true, options), options);
      ParityCase c;
      c.steps = 5;
      check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                         [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, c, raf);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// TestFullyShardCastAfterInit: module->to(kFloat64) after wrapping casts the shards, and
// training then runs in float64 at parity.
class FullyShardCastAfterInit : public testing::WorldSizeTest {};

TEST_P(FullyShardCastAfterInit, ToFloat64AfterInit) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto options = FullyShardOptions().reshard_after_forward(true);
    torch::manual_seed(42);
    Sequential ref = make_multi_group(false, options);
    ref->to(torch::kFloat64);
    torch::manual_seed(42);
    FSDPSequential model(make_multi_group(true, options), options);
    model->to(torch::kFloat64);
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kDouble);
      EXPECT_LE(p.dim(), 2);
    }
    ParityCase c;
    c.dtype = at::kDouble;
    c.steps = 5;
    check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                       [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, c, "float64");
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardCastAfterInit);

// Explicit unshard(async_op = true) before forward (what the seed's 1F1B test does before
// its microbatches): forward then gathers nothing itself.
TEST_P(FullyShard1DTrainingCore, ExplicitAsyncUnshard) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const auto options = FullyShardOptions().reshard_after_forward(false);
    torch::manual_seed(42);
    Sequential ref = make_multi_group(false, options);
    torch::manual_seed(42);
    FSDPSequential model(make_multi_group(true, options), options);
    torch::manual_seed(5);
    at::Tensor x = torch::randn({3, 7});
    std::vector<UnshardHandle> handles;
    CommDebugMode comm;
    for (auto* u : fsdp_units(*model)) handles.push_back(u->unshard(/*async_op=*/true));
    EXPECT_EQ(comm.count("all_gather_into_tensor"), 3);
    for (auto& h : handles) h.wait();
    for (size_t i = 0; i < model->parameters().size(); ++i)
      EXPECT_EQ(model->parameters()[i].sizes(), ref->parameters()[i].sizes()) << "unsharded after wait";
    comm.reset();
    at::Tensor out = model->forward(x);
    EXPECT_EQ(comm.count("all_gather_into_tensor"), 0) << "forward found every unit gathered";
    expect_close(out, ref->forward(x), "output");
    out.sum().backward();
    ref->forward(x).sum().backward();
    EXPECT_EQ(comm.count("reduce_scatter_tensor"), 3);
    auto params = model->parameters();
    auto ref_params = ref->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i].grad(), shard_rows(ref_params[i].grad(), rank, n), "grad " + std::to_string(i));
  });
}

// ---------------------------------------------------------------------------------------------
// Implicit prefetching: after the first iteration recorded the order, a unit's pre-forward
// starts the next unit's all-gather, and a unit's pre-backward the all-gather of the unit
// whose backward comes next.

struct ProbeImpl : torch::nn::Module {
  ProbeImpl(int64_t in, int64_t out, std::function<void(at::Tensor&)> on_forward)
      : on_forward(std::move(on_forward)) {
    lin = register_module("lin", Linear(in, out));
  }
  at::Tensor forward(at::Tensor x) {
    if (on_forward) on_forward(x);
    return lin->forward(x);
  }
  Linear lin{nullptr};
  std::function<void(at::Tensor&)> on_forward;
};
TORCH_MODULE(Probe);

class FullyShardPrefetching : public testing::WorldSizeTest {};

TEST_P(FullyShardPrefetching, ImplicitForwardAndBackwardPrefetch) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    std::unique_ptr<CommDebugMode> comm;
    std::vector<int64_t> gathers_seen;  // all-gathers issued when each probe's forward (or backward) ran
    auto record = [&](at::Tensor&) { gathers_seen.push_back(comm->count("all_gather_into_tensor")); };
    int64_t gathers_at_unit1_backward = -1;
    auto record_backward = [&](at::Tensor& x) {
      record(x);
      if (x.requires_grad())
        x.register_hook([&](const at::Tensor& g) {
          gathers_at_unit1_backward = comm->count("all_gather_into_tensor");
          EXPECT_EQ(comm->count("reduce_scatter_tensor"), 0);
          return g;
        });
    };
    // FSDP2's implicit prefetch is BACKWARD_PRE (fsdpp's default decides after the first backward).
    const auto options = FullyShardOptions().reshard_after_forward(true).backward_prefetch(BackwardPrefetch::BACKWARD_PRE);
    using FSDPProbe = FullyShardedDataParallel<ProbeImpl>;
    torch::manual_seed(42);
    FSDPSequential model(Sequential(FSDPProbe(Probe(7, 9, record), options), ReLU(),
                                    FSDPProbe(Probe(9, 9, record_backward), options), ReLU(), Linear(9, 3)),
                         options);
    for (int step = 0; step < 2; ++step) {
      gathers_seen.clear();
      comm = std::make_unique<CommDebugMode>();
      at::Tensor loss = model->forward(torch::randn({2, 7})).sum();
      ASSERT_EQ(gathers_seen.size(), 2u);
      if (step == 0) {
        // Recording: each unit gathers only itself (root, then unit 0, then unit 1).
        EXPECT_EQ(gathers_seen[0], 2);
        EXPECT_EQ(gathers_seen[1], 3);
      } else {
        // Unit 0's pre-forward already started unit 1's gather.
        EXPECT_EQ(gathers_seen[0], 3);
        EXPECT_EQ(gathers_seen[1], 3);
      }
      comm->reset();
      loss.backward();
      // The order is known from the end of the first forward on, so already the first
      // backward prefetches: the root (kept unsharded) starts unit 1's gather, whose
      // pre-backward starts unit 0's: two gathers by the time unit 1's backward reaches its input.
      EXPECT_EQ(gathers_at_unit1_backward, 2) << "step " << step;
      EXPECT_EQ(comm->count("all_gather_into_tensor"), 2);
      EXPECT_EQ(comm->count("reduce_scatter_tensor"), 3);
      comm.reset();
    }
  });
}

// A Linear in a module named "layer<index>", the name FSDP's profiler spans give its unit; calls
// `on_forward(index, input)` first.
struct NamedLayerImpl : torch::nn::Module {
  NamedLayerImpl(int index, int64_t in, int64_t out, std::function<void(int, at::Tensor&)> on_forward)
      : torch::nn::Module("layer" + std::to_string(index)), index(index), on_forward(std::move(on_forward)) {
    lin = register_module("lin", Linear(in, out));
  }
  at::Tensor forward(at::Tensor x) {
    if (on_forward) on_forward(index, x);
    return lin->forward(x);
  }
  int index;
  std::function<void(int, at::Tensor&)> on_forward;
  Linear lin{nullptr};
};
TORCH_MODULE(NamedLayer);

// test_explicit_prefetching: 8 layers (a unit each) and the root; layer i prefetches layers i + 1
// and i + 2 in forward (i < 6) and layers i - 1 and i - 2 in backward (i >= 2), the seed's
// overlapping windows, so layers 2-6 are asked for twice in each forward (layer 7 too from the
// second step, by layer 6's implicit prefetch) and layers 0-5 in each backward (layer 0 by layer
// 2's list and layer 1's implicit prefetch). reshard_after_forward True and FSDP2's implicit prefetch (BACKWARD_PRE) for the
// units without a list, as the seed. For two steps, from the profiler's trace and CommDebugMode:
// each unit is gathered exactly once per forward (root, layers 0-7) and once per backward (layers
// 7-0: the root stays unsharded), in that order, and when each layer computes exactly the units
// its window reaches have been gathered (forward: the root and layers 0 to min(i + 2, 7); backward,
// at layer i's input gradient: layers 7 down to max(i - 2, 0)). Beyond FSDP2, fsdpp also prefetches
// implicitly in forward from the second step on (the root then starts layer 0's gather), which
// changes none of these. Then, as the seed, training at parity with the plain model (here losses,
// gradient shards and parameters every step, 5 Adam steps; the seed compares losses over 10 AdamW
// steps of a Transformer). What it cannot show: that a prefetched gather overlaps compute (CPU
// ranks, tiny layers).
TEST_P(FullyShardPrefetching, ExplicitPrefetching) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    constexpr int kLayers = 8, kWindow = 2;
    const auto options =
        FullyShardOptions().reshard_after_forward(true).backward_prefetch(BackwardPrefetch::BACKWARD_PRE);
    CommDebugMode* comm = nullptr;
    std::vector<int64_t> at_forward(kLayers, -1), at_input_grad(kLayers, -1);
    auto record = [&](int i, at::Tensor& x) {
      if (!comm) return;
      at_forward[i] = comm->count("all_gather_into_tensor");
      if (x.requires_grad())
        x.register_hook([&, i](const at::Tensor& g) {
          if (comm) at_input_grad[i] = comm->count("all_gather_into_tensor");
          return g;
        });
    };
    using FSDPLayer = FullyShardedDataParallel<NamedLayerImpl>;
    auto build = [&](bool wrap) {
      torch::manual_seed(42);
      Sequential seq;
      for (int i = 0; i < kLayers; ++i) {
        NamedLayer layer(i, i == 0 ? 7 : 8, 8, record);
        if (wrap)
          seq->push_back(FSDPLayer(layer, options));
        else
          seq->push_back(layer);
        seq->push_back(ReLU());
      }
      seq->push_back(Linear(8, 3));
      return seq;
    };
    // The seed's loops, on the units of a wrapped model.
    auto set_windows = [&](FSDPSequential& model) {
      std::vector<std::shared_ptr<FSDPModule>> layers;
      for (int i = 0; i < kLayers; ++i)
        layers.push_back(std::dynamic_pointer_cast<FSDPModule>(model->module()->ptr(2 * i)));
      for (int i = 0; i + kWindow < kLayers; ++i)
        layers[i]->set_modules_to_forward_prefetch({layers[i + 1], layers[i + 2]});
      for (int i = kWindow; i < kLayers; ++i)
        layers[i]->set_modules_to_backward_prefetch({layers[i - 1], layers[i - 2]});
    };
    // "FSDP::unshard unit 5 (layer3)" -> "layer3"; the root's unit -> "root".
    auto unit_of = [](const std::string& span) -> std::string {
      const auto open = span.find("(layer");
      if (open != std::string::npos) return span.substr(open + 1, span.size() - open - 2);
      return span.rfind("FSDP::unshard ", 0) == 0 ? "root" : span;
    };
    std::vector<std::string> forward_order{"root"}, backward_order;
    for (int i = 0; i < kLayers; ++i) forward_order.push_back("layer" + std::to_string(i));
    for (int i = kLayers - 1; i >= 0; --i) backward_order.push_back("layer" + std::to_string(i));

    FSDPSequential model(build(true), options);
    set_windows(model);
    torch::manual_seed(7 + ctx.rank);
    for (int step = 0; step < 2; ++step) {
      const std::string where = "step " + std::to_string(step);
      std::fill(at_forward.begin(), at_forward.end(), -1);
      std::fill(at_input_grad.begin(), at_input_grad.end(), -1);
      CommDebugMode mode;
      comm = &mode;
      profiler::start();
      at::Tensor loss = model->forward(torch::randn({2, 7})).sum();
      profiler::stop();
      const std::string forward_path = ctx.temp_dir + "/forward-" + std::to_string(ctx.rank) + ".json";
      profiler::export_chrome_trace(forward_path);
      EXPECT_EQ(mode.count("all_gather_into_tensor"), kLayers + 1) << where << ": forward";
      mode.reset();
      profiler::start();
      loss.backward();
      profiler::stop();
      const std::string backward_path = ctx.temp_dir + "/backward-" + std::to_string(ctx.rank) + ".json";
      profiler::export_chrome_trace(backward_path);
      EXPECT_EQ(mode.count("all_gather_into_tensor"), kLayers) << where << ": backward";
      comm = nullptr;

      std::vector<std::string> gathered;
      for (const auto& span : testing::Trace(forward_path).issued_in("all_gather_into_tensor"))
        gathered.push_back(unit_of(span));
      EXPECT_EQ(gathered, forward_order) << where << ": forward all-gathers, in issue order";
      gathered.clear();
      for (const auto& span : testing::Trace(backward_path).issued_in("all_gather_into_tensor"))
        gathered.push_back(unit_of(span));
      EXPECT_EQ(gathered, backward_order) << where << ": backward all-gathers, in issue order";
      for (int i = 0; i < kLayers; ++i) {
        // The root, then layers 0 .. min(i + 2, 7).
        EXPECT_EQ(at_forward[i], 1 + std::min(i + kWindow, kLayers - 1) + 1) << where << ": forward of layer " << i;
        // Layer 0's input needs no gradient; layer 1 has no list: implicitly layer 0, already asked for by layer 2.
        if (i > 0) {
          EXPECT_EQ(at_input_grad[i], kLayers - std::max(i - kWindow, 0)) << where << ": backward of layer " << i;
        }
      }
      if (::testing::Test::HasFailure()) return;
    }

    // Parity (a fresh model with the same windows).
    Sequential ref = build(false);
    FSDPSequential trained(build(true), options);
    set_windows(trained);
    ParityCase c;
    c.steps = 5;
    check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *trained,
                       [&](const at::Tensor& x) { return trained->forward(x); }, 7, 3, c, "explicit prefetch");
  });
}

// Beyond the seed: the root prefetches all four blocks in forward, the last block prefetches the
// two before it in backward (one unit's list reaching units that are not its neighbours);
// training stays at parity.
TEST_P(FullyShardPrefetching, ExplicitPrefetchingFromTheRoot) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    CommDebugMode* comm = nullptr;
    std::vector<int64_t> seen;
    int64_t seen_in_backward = -1;
    auto record = [&](at::Tensor&) {
      if (comm) seen.push_back(comm->count("all_gather_into_tensor"));
    };
    auto record_last = [&](at::Tensor& x) {
      record(x);
      if (comm && x.requires_grad())
        x.register_hook([&](const at::Tensor& g) {
          if (comm) seen_in_backward = comm->count("all_gather_into_tensor");
          return g;
        });
    };
    const auto options = FullyShardOptions().reshard_after_forward(true);
    using FSDPProbe = FullyShardedDataParallel<ProbeImpl>;
    auto build = [&](bool wrap) {
      Sequential seq;
      for (int i = 0; i < 4; ++i) {
        Probe probe(i == 0 ? 7 : 9, 9, i == 3 ? std::function<void(at::Tensor&)>(record_last) : record);
        if (wrap)
          seq->push_back(FSDPProbe(probe, options));
        else
          seq->push_back(probe);
        seq->push_back(ReLU());
      }
      seq->push_back(Linear(9, 3));
      return seq;
    };
    torch::manual_seed(42);
    Sequential ref = build(false);
    torch::manual_seed(42);
    FSDPSequential model(build(true), options);
    std::vector<std::shared_ptr<FSDPModule>> blocks;
    for (int i = 0; i < 4; ++i) blocks.push_back(std::dynamic_pointer_cast<FSDPModule>(model->module()->ptr(2 * i)));
    model->set_modules_to_forward_prefetch(blocks);
    blocks[3]->set_modules_to_backward_prefetch({blocks[2], blocks[1]});

    CommDebugMode mode;
    comm = &mode;
    at::Tensor loss = model->forward(torch::randn({2, 7})).sum();
    comm->reset();
    loss.backward();
    // Forward: the root's pre-forward started all five gathers before block 0 ran.
    ASSERT_EQ(seen.size(), 4u);
    for (int64_t s : seen) EXPECT_EQ(s, 5);
    // Backward: the root prefetched block 3 (implicit); block 3 prefetched blocks 2 and 1.
    EXPECT_EQ(seen_in_backward, 3);
    EXPECT_EQ(comm->count("all_gather_into_tensor"), 4);
    comm = nullptr;

    // Parity (a fresh model with the same prefetch settings).
    torch::manual_seed(42);
    Sequential ref2 = build(false);
    torch::manual_seed(42);
    FSDPSequential model2(build(true), options);
    blocks.clear();
    for (int i = 0; i < 4; ++i) blocks.push_back(std::dynamic_pointer_cast<FSDPModule>(model2->module()->ptr(2 * i)));
    model2->set_modules_to_forward_prefetch(blocks);
    blocks[3]->set_modules_to_backward_prefetch({blocks[2], blocks[1]});
    ParityCase c;
    c.steps = 5;
    check_train_parity(ctx, *ref2, [&](const at::Tensor& x) { return ref2->forward(x); }, *model2,
                       [&](const at::Tensor& x) { return model2->forward(x); }, 7, 3, c, "explicit prefetch");
  });
}

// FSDP1's backward_prefetch: BACKWARD_PRE (the default) starts the previous unit's gather in
// this unit's pre-backward, BACKWARD_POST in its post-backward (once its gradients are packed),
// std::nullopt not at all (each unit gathers in its own pre-backward); an explicit list on unit
// 1 runs at the same point (at pre-backward under std::nullopt). Counted when unit 1's backward
// reaches its input and when backward reaches unit 0's output; training at parity.
TEST_P(FullyShardPrefetching, BackwardPrefetchTiming) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    struct Case {
      std::optional<BackwardPrefetch> timing;
      bool explicit_list;
      int64_t gathers_at_unit1_input, gathers_at_unit0_output;
      const char* label;
    };
    for (const Case& c : {Case{BackwardPrefetch::BACKWARD_PRE, false, 2, 2, "BACKWARD_PRE"},
                          Case{BackwardPrefetch::BACKWARD_POST, false, 1, 2, "BACKWARD_POST"},
                          Case{std::nullopt, false, 1, 1, "none"},
                          Case{BackwardPrefetch::BACKWARD_POST, true, 1, 2, "BACKWARD_POST, explicit list"},
                          Case{std::nullopt, true, 2, 2, "none, explicit list"}}) {
      CommDebugMode* comm = nullptr;
      int64_t at_unit1_input = -1, at_unit0_output = -1, reduce_scatters_at_unit0_output = -1;
      auto count_at = [&](at::Tensor& x, int64_t& gathers, int64_t* reduce_scatters) {
        if (comm && x.requires_grad())
          x.register_hook([&gathers, reduce_scatters, &comm](const at::Tensor& g) {
            gathers = comm->count("all_gather_into_tensor");
            if (reduce_scatters) *reduce_scatters = comm->count("reduce_scatter_tensor");
            return g;
          });
      };
      const auto options = FullyShardOptions().reshard_after_forward(true).backward_prefetch(c.timing);
      using FSDPProbe = FullyShardedDataParallel<ProbeImpl>;
      auto build = [&](bool wrap) {
        Probe first(7, 9, nullptr), second(9, 9, [&](at::Tensor& x) { count_at(x, at_unit1_input, nullptr); });
        torch::nn::Functional after_first([&](at::Tensor x) {
          count_at(x, at_unit0_output, &reduce_scatters_at_unit0_output);
          return x;
        });
        if (!wrap) return Sequential(first, after_first, ReLU(), second, ReLU(), Linear(9, 3));
        return Sequential(FSDPProbe(first, options), after_first, ReLU(), FSDPProbe(second, options), ReLU(), Linear(9, 3));
      };
      torch::manual_seed(42);
      Sequential ref = build(false);
      auto set_list = [&](FSDPSequential& m) {
        auto unit = [&](size_t i) { return std::dynamic_pointer_cast<FSDPModule>(m->module()->ptr(i)); };
        if (c.explicit_list) unit(3)->set_modules_to_backward_prefetch({unit(0)});
      };
      torch::manual_seed(42);
      FSDPSequential model(build(true), options);
      set_list(model);
      for (int step = 0; step < 2; ++step) {
        at_unit1_input = at_unit0_output = reduce_scatters_at_unit0_output = -1;
        CommDebugMode mode;
        comm = &mode;
        at::Tensor loss = model->forward(torch::randn({2, 7})).sum();
        mode.reset();
        loss.backward();
        comm = nullptr;
        EXPECT_EQ(at_unit1_input, c.gathers_at_unit1_input) << c.label << ", step " << step;
        EXPECT_EQ(at_unit0_output, c.gathers_at_unit0_output) << c.label << ", step " << step;
        EXPECT_EQ(reduce_scatters_at_unit0_output, 1) << c.label << ", step " << step;
        EXPECT_EQ(mode.count("all_gather_into_tensor"), 2) << c.label;
        EXPECT_EQ(mode.count("reduce_scatter_tensor"), 3) << c.label;
      }
      torch::manual_seed(42);
      FSDPSequential trained(build(true), options);
      set_list(trained);
      ParityCase parity;
      parity.steps = 5;
      check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *trained,
                         [&](const at::Tensor& x) { return trained->forward(x); }, 7, 3, parity, c.label);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardPrefetching);

// ---------------------------------------------------------------------------------------------
// The wrapper in a model's place: a typed member changed in one line, a wrapped Sequential
// inside a Sequential, deduction of the wrapped type, an optimizer built before wrapping.

struct NetImpl : torch::nn::Module {
  NetImpl(bool wrap, const FullyShardOptions& options) {
    torch::nn::Linear plain(7, 9);
    if (wrap)
      fc = register_module("fc", FullyShardedDataParallel<torch::nn::LinearImpl>(plain, options));
    else
      fc_plain = register_module("fc", plain);
    Sequential tail(ReLU(), Linear(9, 3));
    if (wrap)
      head = register_module("head", Sequential(FSDPSequential(tail, options)));
    else
      head = register_module("head", tail);
  }
  at::Tensor forward(const at::Tensor& x) { return head->forward(fc ? fc->forward(x) : fc_plain->forward(x)); }
  // The one-line change: `torch::nn::Linear fc{nullptr};` becomes this.
  FullyShardedDataParallel<torch::nn::LinearImpl> fc{nullptr};
  torch::nn::Linear fc_plain{nullptr};
  Sequential head{nullptr};
};
TORCH_MODULE(Net);

class FullyShardWrapper : public testing::WorldSizeTest {};

TEST_P(FullyShardWrapper, TypedMemberNestedSequentialDeductionAndEarlyOptimizer) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    FullyShardedDataParallel deduced(Linear(3, 4));
    static_assert(std::is_same_v<decltype(deduced), FullyShardedDataParallel<torch::nn::LinearImpl>>);
    EXPECT_EQ(deduced->module()->weight.size(0), (4 + n - 1) / n - (rank == n - 1 ? (4 + n - 1) / n * n - 4 : 0));

    const auto options = FullyShardOptions().reshard_after_forward(true);
    torch::manual_seed(42);
    Net ref(false, options);
    torch::manual_seed(42);
    Net plain(true, options);
    // Built before the root is wrapped (the inner units are already wrapped): same parameter objects.
    torch::optim::SGD early(plain->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    FullyShardedDataParallel<NetImpl> model(plain, options);
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    EXPECT_EQ(fsdp_units(*model).size(), 3u);
    for (int step = 0; step < 3; ++step) {
      torch::manual_seed(step);
      at::Tensor x = torch::randn({kGlobalBatch, 7});
      ref->forward(x).pow(2).mean().backward();
      model->forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
      ref_opt.step();
      early.step();
      ref_opt.zero_grad();
      early.zero_grad();
      auto full = full_params(*model);
      auto ref_params = ref->parameters();
      ASSERT_EQ(full.size(), ref_params.size());
      for (size_t i = 0; i < full.size(); ++i)
        expect_close(full[i], ref_params[i].detach(), "step " + std::to_string(step) + " param " + std::to_string(i));
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardWrapper);

// Resharding really frees the unsharded memory (the buffer's storage shrinks to 0 bytes and
// is reallocated at the next unshard; autograd's saved views keep the same storage).
class FullyShardMemory : public testing::WorldSizeTest {};

TEST_P(FullyShardMemory, ReshardFreesUnshardedMemory) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    FSDPLinear model(Linear(256, 129));
    const int64_t unsharded_bytes = model->unsharded_padded_numel() * 4;
    EXPECT_GE(unsharded_bytes, (256 * 129 + 129) * 4);
    const int64_t base = memory_stats().current_bytes;
    reset_peak_memory_stats();
    model->unshard();
    const int64_t unsharded = memory_stats().current_bytes;
    // (a few bytes of bookkeeping elsewhere may come and go meanwhile)
    EXPECT_GE(unsharded - base, unsharded_bytes - 1024) << "the unsharded buffer is allocated";
    EXPECT_LT(unsharded - base, unsharded_bytes + unsharded_bytes / 4) << "and the gather's staging is freed";
    // Over shared memory (and on one rank) the ranks' chunks land straight in the parameters:
    // no staging copy of the unit ever exists. Over Gloo a rank-major copy lives during the exchange.
    if (ctx.world_size == 1 || detail::uses_shared_memory(model->process_group())) {
      EXPECT_LT(memory_stats().peak_bytes - base, unsharded_bytes + unsharded_bytes / 4) << "no staging copy at any time";
    }
    model->reshard();
    EXPECT_LT(memory_stats().current_bytes - base, unsharded_bytes / 4) << "reshard frees it";
    // Through a training step with reshard_after_forward (a root keeps its parameters, so wrap
    // the unit inside a root): after forward the inner unit's memory is free again although
    // autograd holds views of it, and backward regathers into the same storage.
    torch::manual_seed(1);
    FSDPSequential root(Sequential(FSDPLinear(Linear(256, 129)), ReLU(), Linear(129, 1)));
    auto units = fsdp_units(*root);
    at::Tensor x = torch::randn({2, 256});
    const int64_t before = memory_stats().current_bytes;
    at::Tensor loss = root->forward(x).sum();
    const int64_t inner_bytes = units[1]->unsharded_padded_numel() * 4;
    EXPECT_LT(memory_stats().current_bytes - before, inner_bytes / 2) << "inner unit resharded after forward";
    loss.backward();
    for (const auto& p : root->parameters()) EXPECT_TRUE(p.grad().defined());
  });
}

// Issue 14: a step's peak above what is held between steps. Forward holds the computing unit
// and the prefetched one (gathered straight into its parameters, allocated on the comm thread);
// backward adds the computing unit's full gradients, whose reduce-scatter input is freed on the
// comm thread before the next prefetch is allocated.
// Without backward prefetch a unit's gather waits on the wire behind the previous unit's
// reduce-scatter, whose input is freed first: backward holds one unit and its gradients.
TEST_P(FullyShardMemory, StepPeakIsBoundedByUnits) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (std::optional<BackwardPrefetch> timing :
         {std::optional<BackwardPrefetch>(BackwardPrefetch::BACKWARD_PRE), std::optional<BackwardPrefetch>()}) {
      const std::string label = timing ? "BACKWARD_PRE" : "no backward prefetch";
      const auto options = FullyShardOptions().backward_prefetch(timing);
      torch::manual_seed(3);
      Sequential seq;
      for (int i = 0; i < 4; ++i) {
        seq->push_back(FSDPLinear(Linear(256, 256), options));
        seq->push_back(ReLU());
      }
      seq->push_back(Linear(256, 1));
      FSDPSequential root(seq, options);
      auto units = fsdp_units(*root);
      ASSERT_EQ(units.size(), 5u);
      const double u = static_cast<double>(units[1]->unsharded_padded_numel()) * 4;
      const double root_bytes = static_cast<double>(units[0]->unsharded_padded_numel()) * 4;
      torch::optim::SGD opt(root->parameters(), 0.1);
      at::Tensor x = torch::randn({8, 256});
      auto step = [&] {
        opt.zero_grad();
        root->forward(x).sum().backward();
        opt.step();
      };
      step();  // the order is recorded, prefetching starts, the ring's scratch exists
      // Zeroed, not dropped (libtorch 2.x's zero_grad drops them): the gradient shards are held
      // state, and backward adds into them.
      for (auto& p : root->parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
      reset_peak_memory_stats();
      const double held = static_cast<double>(memory_stats().current_bytes);
      at::Tensor loss = root->forward(x).sum();
      const double forward_peak = static_cast<double>(memory_stats().peak_bytes) - held;
      const double act = static_cast<double>(memory_stats().current_bytes) - held - root_bytes;
      loss.backward();
      const double backward_peak = static_cast<double>(memory_stats().peak_bytes) - held;
      // Beyond the units: a few small tensors; in backward also reduce-scatter outputs (U/N
      // each): with prefetch the unit's and the previous unit's, when its exchange is still
      // running; without, only the previous unit's (its exchange ran before this unit's gather).
      const double slack = 0.1 * u, backward_slack = (timing ? 2 : 1) * u / ctx.world_size + slack;
      EXPECT_LE(forward_peak, act + root_bytes + 2 * u + slack)
          << label << ": forward peak " << forward_peak / u << " U, activations " << act / u << " U, root "
          << root_bytes / u << " U";
      EXPECT_LE(backward_peak, act + root_bytes + (timing ? 3 : 2) * u + backward_slack)
          << label << ": backward peak " << backward_peak / u << " U, activations " << act / u << " U, root "
          << root_bytes / u << " U";
      opt.step();
    }
  });
}

// full_parameters() (what FULL state dicts gather, unit by unit) gathers the unit into a buffer
// of its own and returns views of it: one unit at its peak over shared memory (and on one rank),
// not the buffer and a copy of it; over Gloo the exchange's rank-major staging adds one more.
// The values are copies (writing them leaves the model as it was), equal to the unsharded model's.
TEST_P(FullyShardMemory, FullParametersHoldOneUnit) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    Linear plain(256, 129);
    torch::manual_seed(0);
    FSDPLinear model(Linear(256, 129));
    const int64_t unsharded_bytes = model->unsharded_padded_numel() * 4;
    const int64_t base = memory_stats().current_bytes;
    reset_peak_memory_stats();
    std::vector<at::Tensor> full = model->full_parameters();
    const bool staged = ctx.world_size > 1 && !detail::uses_shared_memory(model->process_group());
    EXPECT_LT(memory_stats().peak_bytes - base, (staged ? 2 : 1) * unsharded_bytes + unsharded_bytes / 8)
        << "rank " << ctx.rank;
    ASSERT_EQ(full.size(), 2u);
    EXPECT_TRUE(at::equal(full[0], plain->weight.detach())) << "rank " << ctx.rank;
    EXPECT_TRUE(at::equal(full[1], plain->bias.detach())) << "rank " << ctx.rank;
    for (auto& t : full) t.fill_(7);
    std::vector<at::Tensor> again = model->full_parameters();
    EXPECT_TRUE(at::equal(again[0], plain->weight.detach())) << "the model's values are untouched, rank " << ctx.rank;
    full.clear();
    again.clear();
    EXPECT_LT(memory_stats().current_bytes - base, unsharded_bytes / 8) << "nothing stays allocated";
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardMemory);

// ---------------------------------------------------------------------------------------------
// Bad input

class FullyShardBadInput : public testing::WorldSizeTest {};

TEST_P(FullyShardBadInput, WrapTwice) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Linear lin(5, 3);
    FSDPLinear first(lin);
    std::string message = "no error";
    try {
      FSDPLinear second(lin);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("parameter 'weight' is already sharded by FSDP unit torch::nn::Linear"), std::string::npos)
        << message;
    message = "no error";
    try {
      FullyShardedDataParallel<FullyShardedDataParallelImpl<torch::nn::LinearImpl>> nested(first);
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("is already a FullyShardedDataParallel"), std::string::npos) << message;
  });
}

TEST_P(FullyShardBadInput, ModelsThatDifferAcrossRanks) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    if (ctx.world_size == 1) return;
    const int odd = ctx.world_size - 1;
    // 8 or 9 rows: at world size 3 both pad to the same chunks, so only a check of the
    // shapes themselves can tell.
    const int64_t rows = ctx.rank == odd ? 9 : 8;
    std::string message = "no error";
    try {
      FSDPLinear model(Linear(5, rows));
    } catch (const Error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("the ranks' models differ; rank " + std::to_string(ctx.rank) + " of group world has 'weight' [" +
                           std::to_string(rows) + ", 5] Float; 'bias' [" + std::to_string(rows) + "] Float;"),
              std::string::npos)
        << message;
    // The group stays usable.
    FSDPLinear same(Linear(5, 3));
    EXPECT_EQ(same->forward(torch::randn({2, 5})).sizes(), (std::vector<int64_t>{2, 3}));
  });
}

// A mesh that does not match the group: options naming two different groups, or a 2-D mesh.
TEST_P(FullyShardBadInput, MeshThatDoesNotMatchTheGroup) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    DeviceMesh mesh = init_device_mesh(ctx.world, {n}, {"shard"});
    std::vector<int> first{0};
    ProcessGroup only_rank0 = ctx.world.new_group(first);
    if (n > 1) {
      std::string error = testing::error_of(
          [&] { FSDPLinear(Linear(3, 4), FullyShardOptions().mesh(mesh).process_group(only_rank0)); });
      EXPECT_NE(error.find("the mesh's group (" + mesh.get_group().name() + ") and process_group (" + only_rank0.name() + ") differ"),
                std::string::npos)
          << error;
    }
    if (n == 4) {
      DeviceMesh three_d = init_device_mesh(ctx.world, {1, 2, 2}, {"pp", "replicate", "shard"});
      std::string error = testing::error_of([&] { FSDPLinear(Linear(3, 4), FullyShardOptions().mesh(three_d)); });
      EXPECT_NE(error.find("a 3-D mesh is not supported"), std::string::npos) << error;
    }
    // A matching pair is fine.
    FSDPLinear ok(Linear(3, 4), FullyShardOptions().mesh(mesh).process_group(ctx.world));
    EXPECT_EQ(ok->forward(torch::randn({2, 3})).sizes(), (std::vector<int64_t>{2, 4}));
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardBadInput);

}  // namespace
}  // namespace fsdpp

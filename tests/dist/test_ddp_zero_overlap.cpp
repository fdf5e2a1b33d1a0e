// DDP + ZeRO overlap (seed 004's test_ddp_zero_overlap): hook_with_zero_step and
// hook_with_zero_step_interleaved, with whole and sharded buckets, at world sizes 1-4.
//
// Each test trains the same model twice for 5 steps with SGD (momentum) and Adam: DDP + a
// ZeroRedundancyOptimizer stepped by the hook during backward, and DDP + a plain local
// optimizer stepped after backward. Both reduce the same gradients through the same buckets,
// and the ZeRO owner of a parameter runs the same optimizer arithmetic on it as the plain
// optimizer, so losses and parameters agree to the last bit in practice; kRtol / kAtol only
// absorb rounding, while a missed, doubled or stale step, or a missing broadcast, moves a
// parameter by ~lr * grad (1e-3 or more).
//
// "During backward" is checked deterministically: an identity Function at the model input
// runs in backward after every other layer's gradient, and records the last layer's weight
// then; it must already differ from the weight before backward and equal the weight after
// the step, on every rank (so bucket 0 was stepped by its owner and broadcast by then).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fsdpp/collectives.h>
#include <fsdpp/ddp_zero_hook.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "dist/ddp_fixtures.h"
#include "dist/zero_suite.h"
#include "harness/multi_process.h"

namespace zero_test {
namespace {

using fsdpp::DistributedDataParallel;
using fsdpp::DistributedDataParallelOptions;
using fsdpp::GradBucket;
using fsdpp::Work;
using fsdpp::testing::RankContext;
using fsdpp::testing::run_ranks;
using fsdpp::testing::ProbeAtInput;
using fsdpp::testing::ThreeLayers;
using fsdpp::testing::WaitInBackward;
using fsdpp::testing::cap_of_floats;
using fsdpp::testing::kHidden;
using fsdpp::testing::kIn;
using fsdpp::testing::kOut;

constexpr double kRtol = 1e-6;
constexpr double kAtol = 1e-7;
constexpr int64_t kBatch = 12;  // divisible by 1, 2, 3 and 4
constexpr int kSteps = 5;

struct Batch {
  at::Tensor x, y;
};

Batch local_batch(int step, int rank, int world_size) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2000 + step);
  at::Tensor x = at::randn({kBatch, kIn}, gen), y = at::randn({kBatch, kOut}, gen);
  const int64_t rows = kBatch / world_size;
  return {x.narrow(0, rank * rows, rows).clone().requires_grad_(true), y.narrow(0, rank * rows, rows)};
}

at::Tensor average_over_ranks(const at::Tensor& local) {
  at::Tensor t = local.detach().clone().reshape({1});
  fsdpp::all_reduce(t, fsdpp::ReduceOp::AVG);
  return t[0];
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, kRtol, kAtol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

enum class Variant { kAfterReduction, kInterleaved };

// Which rank owns each parameter with shard_buckets and buckets {l3.bias 3, l3.weight 24,
// l2.bias 8, l2.weight 64} {l1.bias 8, l1.weight 48}, worked out by hand from PyTorch's
// assignment (_bucket_assignments_per_rank): the smaller bucket first; a run closes before the
// parameter that brings it to 155 / N elements; each run to the least-loaded rank that has no
// run of that bucket. At N = 2, bucket 1 (56) goes whole to rank 0; bucket 0 reaches 77.5 at
// l2.weight, so {l3.*, l2.bias} (35) go to rank 1 and l2.weight to rank 0.
std::map<std::string, int> sharded_bucket_owners(int world_size) {
  const std::vector<std::string> names{"l3.bias", "l3.weight", "l2.bias", "l2.weight", "l1.bias", "l1.weight"};
  const std::map<int, std::vector<int>> owners{
      {1, {0, 0, 0, 0, 0, 0}}, {2, {1, 1, 1, 0, 0, 0}}, {3, {2, 2, 2, 0, 0, 1}}, {4, {2, 2, 2, 3, 0, 1}}};
  std::map<std::string, int> result;
  for (size_t i = 0; i < names.size(); ++i) result[names[i]] = owners.at(world_size)[i];
  return result;
}

// The seed's sweep: gradient_as_bucket_view F/T (on both DDPs: with it on, the gradients the
// hook's ZeRO step reads are views into the reduced buckets) x static_graph F/T (on both: from
// the second step on, buckets are reduced at the counts the first recorded) x shard_buckets F/T
// x the optimizer. Whole buckets use five small buckets (one per parameter but l3's), where nothing
// would be split; shard_buckets uses two buckets that PyTorch's assignment splits at world
// sizes 2-4.
void run_overlap_parity(RankContext& ctx, Variant variant) {
  for (bool gradient_as_bucket_view : {false, true})
  for (bool static_graph : {false, true})
  for (bool shard_buckets : {false, true})
  for (std::string optimizer : {"sgd", "adam"}) {
    SCOPED_TRACE(optimizer + (gradient_as_bucket_view ? ", gradient_as_bucket_view" : "") +
                 (static_graph ? ", static_graph" : "") + (shard_buckets ? ", shard_buckets" : ""));
    const auto options = DistributedDataParallelOptions()
                             .bucket_cap_mb(cap_of_floats(shard_buckets ? 100 : 30))
                             .gradient_as_bucket_view(gradient_as_bucket_view)
                             .static_graph(static_graph);
    torch::manual_seed(300 + ctx.rank);  // rank 0's values arrive by DDP's construction broadcast
    ThreeLayers model;
    torch::manual_seed(300);
    ThreeLayers reference;
    DistributedDataParallel ddp(model, options);
    DistributedDataParallel ref_ddp(reference, options);
    if (shard_buckets)
      ASSERT_EQ(ddp.bucket_parameter_names(), (std::vector<std::vector<std::string>>{
                                                  {"l3.bias", "l3.weight", "l2.bias", "l2.weight"}, {"l1.bias", "l1.weight"}}));
    else
      ASSERT_EQ(ddp.bucket_parameter_names(), (std::vector<std::vector<std::string>>{
                                                  {"l3.bias", "l3.weight"}, {"l2.bias"}, {"l2.weight"}, {"l1.bias"}, {"l1.weight"}}));

    std::unique_ptr<fsdpp::ZeroRedundancyOptimizerBase> zero;
    std::unique_ptr<torch::optim::Optimizer> plain;
    if (optimizer == "sgd") {
      const auto o = torch::optim::SGDOptions(0.1).momentum(0.9);
      zero = std::make_unique<fsdpp::ZeroRedundancyOptimizer<torch::optim::SGD>>(model->parameters(), o);
      plain = std::make_unique<torch::optim::SGD>(reference->parameters(), o);
    } else {
      const auto o = torch::optim::AdamOptions(0.01);
      zero = std::make_unique<fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam>>(model->parameters(), o);
      plain = std::make_unique<torch::optim::Adam>(reference->parameters(), o);
    }

    Work bucket0;
    bool bucket0_launched = false;
    if (variant == Variant::kAfterReduction) {
      fsdpp::hook_with_zero_step(ddp, *zero, shard_buckets);
      // The comm hook stays free: the default reduction, remembering bucket 0's Work.
      ddp.register_comm_hook([&](GradBucket& bucket) {
        Work work = fsdpp::all_reduce(bucket.buffer(), fsdpp::ReduceOp::AVG, bucket.process_group(), true);
        if (bucket.index() == 0) {
          bucket0 = work;
          bucket0_launched = true;
        }
        return work;
      });
    } else {
      fsdpp::hook_with_zero_step_interleaved(ddp, *zero, shard_buckets);
    }
    ASSERT_TRUE(zero->overlap_with_ddp());

    // Whole buckets: bucket b belongs to rank b % world_size. Sharded: the table above.
    std::map<std::string, int> expected_owner;
    const auto names = ddp.bucket_parameter_names();
    for (size_t b = 0; b < names.size(); ++b)
      for (const auto& name : names[b]) expected_owner[name] = static_cast<int>(b % ctx.world_size);
    if (shard_buckets) expected_owner = sharded_bucket_owners(ctx.world_size);
    std::map<std::string, int> owner;  // from the partition, by the parameters' names
    const auto keys = model->named_parameters().keys();  // the optimizer's parameter order
    for (int r = 0; r < ctx.world_size; ++r)
      for (int64_t i : zero->partition()[r]) owner[keys[i]] = r;
    EXPECT_EQ(owner, expected_owner);
    size_t owned = 0, local_params = 0;
    for (const auto& [name, r] : expected_owner) owned += r == ctx.rank;
    for (const auto& g : zero->optim().param_groups()) local_params += g.params().size();
    EXPECT_EQ(local_params, owned) << "the wrapped optimizer holds exactly this rank's parameters";

    const at::Tensor l3_weight = model->l3->weight;
    for (int step = 0; step < kSteps; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const Batch local = local_batch(step, ctx.rank, ctx.world_size);

      zero->zero_grad();
      const at::Tensor before = l3_weight.detach().clone();
      at::Tensor at_probe;
      ProbeAtInput::reached = [&] { at_probe = l3_weight.detach().clone(); };
      bucket0_launched = false;
      // static_graph's first backward records the graph and reduces every bucket at its end
      // (PyTorch's delay_all_reduce): nothing overlaps in it.
      const bool recording = static_graph && step == 0;
      // With shard_buckets bucket 0 also holds l2, whose gradients come after the wait.
      if (variant == Variant::kAfterReduction && !shard_buckets && !recording)
        WaitInBackward::done = [&] { return bucket0_launched && bucket0.is_completed(); };
      at::Tensor loss = torch::mse_loss(ddp.forward(local.x), local.y);
      loss.backward();
      WaitInBackward::done = nullptr;
      ProbeAtInput::reached = nullptr;
      EXPECT_FALSE(zero->step().defined());  // a no-op: the hook already stepped

      ASSERT_TRUE(at_probe.defined()) << "the probe at the model input did not run in backward";
      if (recording) {
        EXPECT_TRUE(at::equal(at_probe, before)) << "static_graph's first backward stepped before its end";
      } else if (!shard_buckets || variant == Variant::kInterleaved) {
        EXPECT_FALSE(at::equal(at_probe, before)) << "bucket 0 (l3) was not yet stepped when backward reached the input";
        EXPECT_TRUE(at::equal(at_probe, l3_weight.detach())) << "l3.weight changed after backward reached the input";
      }

      plain->zero_grad();
      at::Tensor ref_loss = torch::mse_loss(ref_ddp.forward(local.x), local.y);
      ref_loss.backward();
      plain->step();

      expect_close(average_over_ranks(loss), average_over_ranks(ref_loss), "loss");
      auto actual = model->named_parameters(), expected = reference->named_parameters();
      for (const auto& item : expected) expect_close(actual[item.key()], item.value(), "parameter " + item.key());
    }
  }
}

TEST_P(ZeroRedundancyOptimizer, DdpZeroOverlap) {
  run_ranks(GetParam(), [](RankContext& ctx) { run_overlap_parity(ctx, Variant::kAfterReduction); });
}

TEST_P(ZeroRedundancyOptimizer, DdpZeroOverlapInterleaved) {
  run_ranks(GetParam(), [](RankContext& ctx) { run_overlap_parity(ctx, Variant::kInterleaved); });
}

}  // namespace
}  // namespace zero_test

// DistributedDataParallel at world sizes 1-4: parity with single-process training on the
// global batch, bucketing, no_sync, unused parameters, buffers, comm hooks, overlap, and the
// errors of bad input.
//
// Tolerance. Parity compares float32 results computed in different summation orders: the
// reference sums the whole batch's per-sample gradients in one matmul, DDP sums each rank's
// slice, then all_reduce adds the ranks' sums in Gloo's ring order and divides. The two differ
// in the last bits (~1e-7 relative) and the difference grows a little over the steps; kRtol /
// kAtol leave ~100x room for that, while any real error (a missing or doubled average, a
// stale bucket, a wrong parameter) moves values by ~lr * grad, i.e. 1e-3 or more.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/join.h>

#include "comm/wire_bytes.h"
#include "dist/ddp_fixtures.h"
#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::RankContext;
using testing::run_ranks;
using testing::ThreeLayers;
using testing::WaitInBackward;
using testing::cap_of_floats;
using testing::kHidden;
using testing::kIn;
using testing::kOut;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
constexpr int64_t kBatch = 12;  // divisible by 1, 2, 3 and 4

// Linear(6, 8) -> tanh -> Linear(8, 8) -> tanh -> Linear(8, 3). Parameters in registration
// order: 0.weight (48), 0.bias (8), 2.weight (64), 2.bias (8), 4.weight (24), 4.bias (3).
torch::nn::Sequential make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(kHidden, kHidden), torch::nn::Functional(torch::tanh),
                               torch::nn::Linear(kHidden, kOut));
}

struct Batch {
  at::Tensor x, y;
};

// The same data on every rank: its own generator, independent of the model's seed.
Batch global_batch(int step, int64_t rows = kBatch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {at::randn({rows, kIn}, gen), at::randn({rows, kOut}, gen)};
}

Batch slice(const Batch& b, int rank, int world_size) {
  const int64_t rows = b.x.size(0) / world_size;
  return {b.x.narrow(0, rank * rows, rows), b.y.narrow(0, rank * rows, rows)};
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return torch::mse_loss(out, target); }

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what << ": one is undefined";
  if (!actual.defined()) return;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, kRtol, kAtol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

void expect_same_parameters(torch::nn::Module& actual, torch::nn::Module& expected, const std::string& what) {
  auto a = actual.named_parameters(), e = expected.named_parameters();
  ASSERT_EQ(a.size(), e.size());
  for (const auto& item : e) expect_close(a[item.key()], item.value(), what + " parameter " + item.key());
}

void expect_same_gradients(torch::nn::Module& actual, torch::nn::Module& expected, const std::string& what) {
  auto a = actual.named_parameters(), e = expected.named_parameters();
  for (const auto& item : e) expect_close(a[item.key()].grad(), item.value().grad(), what + " gradient of " + item.key());
}

void clear_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad().reset();
}

// The mean of every rank's local loss, to compare with the reference's global-batch loss.
at::Tensor average_over_ranks(const at::Tensor& local) {
  at::Tensor t = local.detach().clone().reshape({1});
  all_reduce(t, ReduceOp::AVG);
  return t[0];
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::string& name, std::vector<at::Tensor> params) {
  if (name == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// fc1 -> [branch] -> fc2, and `never`, which no forward uses. Registration order puts
// `never` last, so it lands in bucket 0, the first one reduced.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    branch = register_module("branch", torch::nn::Linear(kHidden, kHidden));
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kOut));
    never = register_module("never", torch::nn::Linear(kHidden, kHidden));
  }
  at::Tensor forward(const at::Tensor& x, bool use_branch) {
    at::Tensor h = torch::tanh(fc1(x));
    if (use_branch) h = torch::tanh(branch(h));
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, branch{nullptr}, fc2{nullptr}, never{nullptr};
};
TORCH_MODULE(Branchy);

Branchy make_branchy(uint64_t seed) {
  torch::manual_seed(seed);
  return Branchy();
}

// A linear layer with a buffer that forward reads (so its value matters).
struct ScaledImpl : torch::nn::Module {
  explicit ScaledImpl(float scale) {
    fc = register_module("fc", torch::nn::Linear(kIn, kOut));
    this->scale = register_buffer("scale", at::full({kOut}, scale));
  }
  at::Tensor forward(const at::Tensor& x) { return fc(x) * scale; }
  torch::nn::Linear fc{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Scaled);

// fc1 -> shared -> shared -> fc2: `shared` runs twice per forward, checkpointed or not. When
// checkpointed, each run recomputes in its own nested backward, so `shared`'s gradient hooks
// fire twice in one backward. Parameters in the same positions (and values, by seed) either way.
struct TwiceThroughImpl : torch::nn::Module {
  explicit TwiceThroughImpl(bool checkpointed) {
    fc1 = register_module("fc1", torch::nn::Linear(kIn, kHidden));
    torch::nn::Linear shared(kHidden, kHidden);
    if (checkpointed) {
      auto wrapped = register_module("shared", checkpoint_wrapper(shared));
      run_shared = [wrapped](const at::Tensor& x) mutable { return wrapped->forward(x); };
    } else {
      register_module("shared", shared);
      run_shared = [shared](const at::Tensor& x) mutable { return shared->forward(x); };
    }
    fc2 = register_module("fc2", torch::nn::Linear(kHidden, kOut));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::tanh(fc1(x));
    h = torch::tanh(run_shared(torch::tanh(run_shared(h))));
    return fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::function<at::Tensor(const at::Tensor&)> run_shared;
};
TORCH_MODULE(TwiceThrough);

class DDP : public testing::WorldSizeTest {};
// Tests that can only fail with more than one rank.
class DDPMultiRank : public testing::WorldSizeTest {};
class DDPBadInput : public testing::WorldSizeTest {};

TEST_P(DDP, ParityWithLocalTrainingSGDAndAdam) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (std::string optimizer : {"sgd", "adam"}) {
      SCOPED_TRACE(optimizer);
      auto reference = make_mlp(100);
      auto model = make_mlp(100 + ctx.rank);  // rank 0's values arrive by the construction broadcast
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80)));
      ASSERT_EQ(ddp.num_buckets(), 3u);
      auto opt = make_optimizer(optimizer, model->parameters());
      auto ref_opt = make_optimizer(optimizer, reference->parameters());
      for (int step = 0; step < 8; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const Batch batch = global_batch(step);
        const Batch local = slice(batch, ctx.rank, ctx.world_size);
        opt->zero_grad();
        at::Tensor loss = mse(ddp.forward(local.x), local.y);
        loss.backward();
        opt->step();
        ref_opt->zero_grad();
        at::Tensor ref_loss = mse(reference->forward(batch.x), batch.y);
        ref_loss.backward();
        ref_opt->step();
        expect_close(average_over_ranks(loss), ref_loss.detach(), "loss");
        expect_same_parameters(*model, *reference, "after the step");
      }
    }
  });
}

// Trains `ddp` on each rank's slice and the plain `reference` on the global batch; after each
// backward their gradients must agree. By position: checkpointed layers' names carry
// "_checkpoint_wrapped_module".
template <typename M, typename R>
void train_checkpointed_against_reference(RankContext& ctx, DistributedDataParallel<M>& ddp, R& reference,
                                          const std::string& optimizer, int steps) {
  auto opt = make_optimizer(optimizer, ddp.module()->parameters());
  auto ref_opt = make_optimizer(optimizer, reference.parameters());
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Batch batch = global_batch(step);
    const Batch local = slice(batch, ctx.rank, ctx.world_size);
    opt->zero_grad();
    mse(ddp.forward(local.x), local.y).backward();
    ref_opt->zero_grad();
    mse(reference.forward(batch.x), batch.y).backward();
    const auto params = ddp.module()->parameters(), ref_params = reference.parameters();
    ASSERT_EQ(params.size(), ref_params.size());
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i].grad(), ref_params[i].grad(), "gradient of parameter " + std::to_string(i));
    opt->step();
    ref_opt->step();
  }
}

// Checkpointed layers recompute in a backward nested inside the outer one (the reentrant
// scheme), so their parameters' gradient hooks fire there: checkpointing the last layer makes
// the first hook of the backward a nested one, and checkpointing every layer makes all of them.
TEST_P(DDP, ActivationCheckpointedLayersMatchLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (bool every_layer : {false, true}) {
      SCOPED_TRACE(every_layer ? "every Linear checkpointed" : "the last Linear checkpointed");
      auto reference = make_mlp(21);
      auto plain = make_mlp(21 + ctx.rank);
      torch::nn::Sequential model;
      for (size_t i = 0; i < plain->size(); ++i) {
        const torch::nn::AnyModule& layer = plain->begin()[static_cast<std::ptrdiff_t>(i)];
        auto linear = std::dynamic_pointer_cast<torch::nn::LinearImpl>(layer.ptr());
        if (linear && (every_layer || i + 1 == plain->size()))
          model->push_back(checkpoint_wrapper(torch::nn::Linear(linear)));
        else
          model->push_back(layer);
      }
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(40)));
      train_checkpointed_against_reference(ctx, ddp, *reference, "sgd", 3);
    }
  });
}

TEST_P(DDP, StaticGraphReducesALayerCheckpointedTwice) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const Batch batch = global_batch(0);
    const Batch local = slice(batch, ctx.rank, ctx.world_size);
    {
      torch::manual_seed(31);
      TwiceThrough model(true);
      DistributedDataParallel ddp(model);
      std::string message = error_of([&] { mse(ddp.forward(local.x), local.y).backward(); });
      EXPECT_NE(message.find("got a gradient twice"), std::string::npos)
          << message;
      EXPECT_NE(message.find("'shared._checkpoint_wrapped_module."), std::string::npos) << message;
      EXPECT_NE(message.find("static_graph(true)"), std::string::npos) << message;
    }
    torch::manual_seed(31);
    TwiceThrough reference(false);
    torch::manual_seed(31 + ctx.rank);  // rank 0's values arrive by the construction broadcast
    TwiceThrough model(true);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().static_graph(true).bucket_cap_mb(cap_of_floats(80)));
    train_checkpointed_against_reference(ctx, ddp, *reference, "adam", 4);  // step 0 records the graph
  });
}

// Each rank's graph stays the same (rank 1 uses `branch`, the others do not; nobody uses
// `never`): the first backward finds the unused parameters with one used-map all_reduce, the
// later ones need neither the search nor the all_reduce.
TEST_P(DDP, StaticGraphFindsUnusedParametersOnceWithoutAPerStepAllReduce) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    auto uses_branch = [](int rank) { return rank % 2 == 1; };
    auto reference = make_branchy(5);
    auto model = make_branchy(5);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().static_graph(true).bucket_cap_mb(cap_of_floats(80)));
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
    torch::optim::Adam ref_opt(reference->parameters(), torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 4; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      const Batch batch = global_batch(step);
      const Batch local = slice(batch, ctx.rank, n);
      clear_grads(*model);
      CommDebugMode comm;
      mse(ddp.forward(local.x, uses_branch(ctx.rank)), local.y).backward();
      EXPECT_EQ(comm.count("all_reduce"), static_cast<int64_t>(ddp.num_buckets()) + (step == 0 ? 1 : 0))
          << "the buckets, and the used-parameter map in the first backward only";
      clear_grads(*reference);
      at::Tensor ref_loss = at::zeros({});
      for (int r = 0; r < n; ++r) {
        const Batch s = slice(batch, r, n);
        ref_loss = ref_loss + mse(reference->forward(s.x, uses_branch(r)), s.y);
      }
      (ref_loss / n).backward();
      EXPECT_FALSE(model->never->weight.grad().defined()) << "no rank used `never`: its .grad must stay undefined";
      EXPECT_EQ(model->branch->weight.grad().defined(), n > 1) << "`branch` is used by rank 1 when there is one";
      expect_same_gradients(*model, *reference, "averaged");
      opt.step();
      ref_opt.step();
    }
  });
}

TEST_P(DDP, StaticGraphThatChangesIsAnErrorNamingTheParameter) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    for (bool first_uses_branch : {true, false}) {
      SCOPED_TRACE(first_uses_branch ? "branch dropped after the first backward" : "branch added after it");
      auto model = make_branchy(3);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().static_graph(true));
      mse(ddp.forward(local.x, first_uses_branch), local.y).backward();
      std::string message = error_of([&] { mse(ddp.forward(local.x, !first_uses_branch), local.y).backward(); });
      EXPECT_NE(message.find("static_graph"), std::string::npos) << message;
      EXPECT_NE(message.find("'branch."), std::string::npos) << message;
      EXPECT_NE(message.find(first_uses_branch ? "fewer gradients than in the first backward" : "0 times in the first one"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("rank " + std::to_string(ctx.rank)), std::string::npos) << message;
    }
  });
}

TEST_P(DDP, ReplicateAveragesGradientsLikeTheConstructor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto reference = make_mlp(7);
    auto model = make_mlp(7 + ctx.rank);
    auto ddp = replicate(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(50)));
    static_assert(std::is_same_v<decltype(ddp), DistributedDataParallel<torch::nn::SequentialImpl>>);
    const Batch batch = global_batch(0);
    const Batch local = slice(batch, ctx.rank, ctx.world_size);
    mse(ddp(local.x), local.y).backward();
    mse(reference->forward(batch.x), batch.y).backward();
    expect_same_gradients(*model, *reference, "replicate");
  });
}

TEST_P(DDP, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    constexpr int kMicrobatches = 3;  // 2 under no_sync, the last one synchronized
    for (bool as_view : {false, true}) {
      SCOPED_TRACE(as_view ? "gradient_as_bucket_view" : "copied gradients");
      auto reference = make_mlp(11);
      auto model = make_mlp(11);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions()
                                             .bucket_cap_mb(cap_of_floats(80))
                                             .gradient_as_bucket_view(as_view));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int round = 0; round < 3; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        opt.zero_grad();
        std::vector<at::Tensor> xs, ys;
        for (int m = 0; m < kMicrobatches; ++m) {
          const Batch batch = global_batch(10 * round + m);
          xs.push_back(batch.x);
          ys.push_back(batch.y);
          const Batch local = slice(batch, ctx.rank, ctx.world_size);
          if (m + 1 < kMicrobatches) {
            CommDebugMode comm;
            auto guard = ddp.no_sync();
            mse(ddp.forward(local.x), local.y).backward();
            EXPECT_EQ(comm.count("all_reduce"), 0) << "no_sync backward communicated";
          } else {
            CommDebugMode comm;
            mse(ddp.forward(local.x), local.y).backward();
            EXPECT_EQ(comm.count("all_reduce"), 3) << "the synchronized backward reduces every bucket once";
          }
        }
        // Reference: the microbatches' mean losses summed, i.e. kMicrobatches x the mean over
        // the concatenated batch.
        ref_opt.zero_grad();
        (mse(reference->forward(at::cat(xs)), at::cat(ys)) * kMicrobatches).backward();
        expect_same_gradients(*model, *reference, "accumulated");
        opt.step();
        ref_opt.step();
        expect_same_parameters(*model, *reference, "after the step");
      }
    }
  });
}

TEST_P(DDP, FindUnusedParametersReducesLocallyUnusedAsZerosAndLeavesGloballyUnusedAlone) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    auto uses_branch = [](int rank) { return rank % 2 == 1; };  // never at world size 1
    for (bool through_ddp_forward : {true, false}) {
      SCOPED_TRACE(through_ddp_forward ? "forward through DDP (graph traversal)" : "module called directly");
      auto reference = make_branchy(5);
      auto model = make_branchy(5);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions()
                                             .find_unused_parameters(true)
                                             .bucket_cap_mb(cap_of_floats(80)));
      torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.01));
      torch::optim::Adam ref_opt(reference->parameters(), torch::optim::AdamOptions(0.01));
      for (int step = 0; step < 4; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const Batch batch = global_batch(step);
        const Batch local = slice(batch, ctx.rank, n);
        clear_grads(*model);  // undefined grads: a locally unused parameter must enter its bucket as zeros
        at::Tensor out = through_ddp_forward ? ddp.forward(local.x, uses_branch(ctx.rank))
                                             : model->forward(local.x, uses_branch(ctx.rank));
        mse(out, local.y).backward();
        // Reference: the ranks' losses averaged, each rank taking its own path.
        clear_grads(*reference);
        at::Tensor ref_loss = at::zeros({});
        for (int r = 0; r < n; ++r) {
          const Batch s = slice(batch, r, n);
          ref_loss = ref_loss + mse(reference->forward(s.x, uses_branch(r)), s.y);
        }
        (ref_loss / n).backward();
        EXPECT_FALSE(model->never->weight.grad().defined()) << "no rank used `never`: its .grad must stay undefined";
        EXPECT_EQ(model->branch->weight.grad().defined(), n > 1) << "`branch` is used by rank 1 when there is one";
        expect_same_gradients(*model, *reference, "averaged");
        opt.step();
        ref_opt.step();
        expect_same_parameters(*model, *reference, "after the step");
      }
    }
  });
}

TEST_P(DDP, UnusedParameterWithoutFindUnusedParametersIsAnErrorNamingIt) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_branchy(3);
    DistributedDataParallel ddp(model);
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    for (int attempt = 0; attempt < 2; ++attempt) {  // the error leaves DDP usable for the next backward
      SCOPED_TRACE("attempt " + std::to_string(attempt));
      std::string message = error_of([&] { mse(ddp.forward(local.x, true), local.y).backward(); });
      EXPECT_NE(message.find("got no gradient"), std::string::npos) << message;
      EXPECT_NE(message.find("'never.weight', 'never.bias'"), std::string::npos) << message;
      EXPECT_EQ(message.find("fc1"), std::string::npos) << message;
      EXPECT_NE(message.find("find_unused_parameters(true)"), std::string::npos) << message;
      EXPECT_NE(message.find("rank " + std::to_string(ctx.rank)), std::string::npos) << message;
    }
  });
}

TEST_P(DDP, BucketsFollowTheCapInReverseRegistrationOrderWithOneAllReduceEach) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    using Names = std::vector<std::vector<std::string>>;
    struct Case {
      double cap_mb;
      Names buckets;
    };
    // Reversed order: 4.bias 3, 4.weight 24, 2.bias 8, 2.weight 64, 0.bias 8, 0.weight 48 floats.
    const std::vector<Case> cases = {
        {25.0, {{"4.bias", "4.weight", "2.bias", "2.weight", "0.bias", "0.weight"}}},
        // 3 + 24 + 8 = 35, + 64 > 80; 64 + 8 = 72, + 48 > 80; 48.
        {cap_of_floats(80), {{"4.bias", "4.weight", "2.bias"}, {"2.weight", "0.bias"}, {"0.weight"}}},
        // Smaller than most parameters: each gets a bucket of its own.
        {cap_of_floats(5), {{"4.bias"}, {"4.weight"}, {"2.bias"}, {"2.weight"}, {"0.bias"}, {"0.weight"}}},
    };
    const std::map<std::string, int64_t> numel = {{"0.weight", 48}, {"0.bias", 8}, {"2.weight", 64},
                                                  {"2.bias", 8},    {"4.weight", 24}, {"4.bias", 3}};
    for (const auto& c : cases) {
      SCOPED_TRACE("bucket_cap_mb " + std::to_string(c.cap_mb));
      auto model = make_mlp(1);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(c.cap_mb));
      EXPECT_EQ(ddp.bucket_parameter_names(), c.buckets);
      int64_t expected_bytes = 0;
      for (const auto& bucket : c.buckets) {
        int64_t floats = 0;
        for (const auto& name : bucket) floats += numel.at(name);
        expected_bytes += detail::ring_all_reduce_bytes(floats * 4, 4, ctx.rank, ctx.world_size);
      }
      const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
      for (int step = 0; step < 2; ++step) {
        CommDebugMode comm;
        mse(ddp.forward(local.x), local.y).backward();
        EXPECT_EQ(comm.count("all_reduce"), static_cast<int64_t>(c.buckets.size()));
        EXPECT_EQ(comm.get_total_counts(), static_cast<int64_t>(c.buckets.size())) << "only the buckets' all_reduces";
        EXPECT_EQ(comm.bytes_sent("all_reduce"), expected_bytes);
      }
    }
  });
}

TEST_P(DDP, GradientAsBucketViewMatchesLocalTrainingAndGradientsLiveInTheBuckets) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (std::string optimizer : {"sgd", "adam"}) {
      SCOPED_TRACE(optimizer);
      auto reference = make_mlp(21);
      auto model = make_mlp(21);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions()
                                             .bucket_cap_mb(cap_of_floats(80))
                                             .gradient_as_bucket_view(true));
      std::vector<at::Tensor> buffers(ddp.num_buckets());
      ddp.register_bucket_reduced_callback([&](GradBucket& b) { buffers[b.index()] = b.buffer(); });
      auto opt = make_optimizer(optimizer, model->parameters());
      auto ref_opt = make_optimizer(optimizer, reference->parameters());
      for (int step = 0; step < 6; ++step) {
        SCOPED_TRACE("step " + std::to_string(step));
        const Batch batch = global_batch(step);
        const Batch local = slice(batch, ctx.rank, ctx.world_size);
        opt->zero_grad();  // libtorch's zero_grad detach_()es: the views must allow it
        mse(ddp.forward(local.x), local.y).backward();
        ref_opt->zero_grad();
        mse(reference->forward(batch.x), batch.y).backward();
        for (const auto& item : model->named_parameters()) {
          const at::Tensor& grad = item.value().grad();
          bool inside = false;
          for (const auto& buffer : buffers) inside = inside || (buffer.defined() && grad.is_alias_of(buffer));
          EXPECT_TRUE(inside) << item.key() << "'s .grad is not a view into a bucket";
        }
        expect_same_gradients(*model, *reference, "averaged");
        opt->step();
        ref_opt->step();
        expect_same_parameters(*model, *reference, "after the step");
      }
    }
  });
}

TEST_P(DDP, CommHookRunsOncePerBucketPerStepAndItsResultBecomesTheGradient) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto reference = make_mlp(31);
    auto model = make_mlp(31);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80)));
    const auto expected_names = ddp.bucket_parameter_names();
    std::vector<int> calls(ddp.num_buckets(), 0);
    ddp.register_comm_hook([&](GradBucket& bucket) {
      ++calls.at(bucket.index());
      EXPECT_EQ(bucket.is_last(), bucket.index() + 1 == expected_names.size());
      EXPECT_EQ(bucket.parameter_names(), expected_names[bucket.index()]);
      EXPECT_EQ(bucket.parameters().size(), bucket.gradients().size());
      for (size_t i = 0; i < bucket.gradients().size(); ++i) {
        EXPECT_EQ(bucket.gradients()[i].sizes(), bucket.parameters()[i].sizes());
        EXPECT_EQ(bucket.gradients()[i].data_ptr(), bucket.buffer().narrow(0, bucket.offsets()[i], 1).data_ptr());
      }
      return all_reduce(bucket.buffer(), ReduceOp::SUM, bucket.process_group(), /*async_op=*/true);  // no averaging
    });
    std::string twice = error_of([&] { ddp.register_comm_hook([](GradBucket&) { return Work(); }); });
    EXPECT_NE(twice.find("already registered"), std::string::npos) << twice;
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::fill(calls.begin(), calls.end(), 0);
      clear_grads(*model);
      clear_grads(*reference);
      const Batch batch = global_batch(step);
      const Batch local = slice(batch, ctx.rank, ctx.world_size);
      mse(ddp.forward(local.x), local.y).backward();
      EXPECT_EQ(calls, std::vector<int>(expected_names.size(), 1));
      // The hook summed without dividing: .grad is world_size x the average.
      (mse(reference->forward(batch.x), batch.y) * ctx.world_size).backward();
      expect_same_gradients(*model, *reference, "summed by the hook");
    }
  });
}

// Registers through the untyped DDP, as code that takes any DDP (ZeRO's overlap) does.
void record_reduced_buckets(DistributedDataParallel<>& ddp, std::vector<size_t>& order,
                            std::map<std::string, at::Tensor>& seen) {
  ddp.register_bucket_reduced_callback([&](GradBucket& bucket) {
    order.push_back(bucket.index());
    for (size_t i = 0; i < bucket.parameters().size(); ++i)
      seen[bucket.parameter_names()[i]] = bucket.parameters()[i].grad().clone();
  });
}

TEST_P(DDP, BucketReducedCallbacksRunInOrderOncePerBucketWithAveragedGradients) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto reference = make_mlp(41);
    auto model = make_mlp(41);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80)));
    std::vector<size_t> order;
    std::map<std::string, at::Tensor> seen;  // .grad as the callback saw it
    record_reduced_buckets(ddp, order, seen);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      order.clear();
      seen.clear();
      clear_grads(*model);
      clear_grads(*reference);
      const Batch batch = global_batch(step);
      const Batch local = slice(batch, ctx.rank, ctx.world_size);
      mse(ddp.forward(local.x), local.y).backward();
      mse(reference->forward(batch.x), batch.y).backward();
      EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2}));
      for (const auto& item : reference->named_parameters())
        expect_close(seen[item.key()], item.value().grad(), "callback's view of " + item.key());
    }
  });
}

// The pattern ZeRO's overlap needs: each bucket's callback communicates (here, each bucket's
// owner broadcasts its values) on a second group, while DDP's all_reduces are in flight.
TEST_P(DDP, BucketReducedCallbackMayCommunicateOnAnotherGroup) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto reference = make_mlp(45);
    auto model = make_mlp(45);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(5)));
    ProcessGroup side = ddp.process_group().new_group(ddp.process_group().ranks());
    int broadcasts = 0;
    ddp.register_bucket_reduced_callback([&](GradBucket& bucket) {
      const int owner = side.global_rank(static_cast<int>(bucket.index() % side.size()));
      at::Tensor values = bucket.buffer().clone();
      broadcast(values, owner, side);
      EXPECT_TRUE(at::equal(values, bucket.buffer())) << "bucket " << bucket.index() << " differs from rank " << owner << "'s";
      ++broadcasts;
    });
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      clear_grads(*model);
      clear_grads(*reference);
      const Batch batch = global_batch(step);
      const Batch local = slice(batch, ctx.rank, ctx.world_size);
      mse(ddp.forward(local.x), local.y).backward();
      mse(reference->forward(batch.x), batch.y).backward();
      expect_same_gradients(*model, *reference, "averaged");
    }
    EXPECT_EQ(broadcasts, 3 * 6);
  });
}

// Bucket 0 (l3) is launched before the wait and completes during it; the next gradient's hook
// sees it done and runs its callback then, before l1's gradient exists: the point ZeRO's
// overlap uses.
TEST_P(DDP, BucketReducedCallbackRunsDuringBackwardOnceTheReductionIsDone) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(47);
    ThreeLayers model;
    // Reversed: l3.bias 3, l3.weight 24, l2.bias 8, l2.weight 64, l1.bias 8, l1.weight 48 floats.
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(30)));
    ASSERT_EQ(ddp.bucket_parameter_names(), (std::vector<std::vector<std::string>>{
                                                {"l3.bias", "l3.weight"}, {"l2.bias"}, {"l2.weight"}, {"l1.bias"}, {"l1.weight"}}));
    Work bucket0;
    bool bucket0_launched = false;
    ddp.register_comm_hook([&](GradBucket& bucket) {
      Work work = all_reduce(bucket.buffer(), ReduceOp::AVG, bucket.process_group(), /*async_op=*/true);
      if (bucket.index() == 0) {
        bucket0 = work;
        bucket0_launched = true;
      }
      return work;
    });
    WaitInBackward::done = [&] { return bucket0_launched && bucket0.is_completed(); };
    std::vector<int> l1_grad_defined;
    ddp.register_bucket_reduced_callback([&](GradBucket&) { l1_grad_defined.push_back(model->l1->weight.grad().defined()); });
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    mse(ddp.forward(local.x), local.y).backward();
    WaitInBackward::done = nullptr;
    EXPECT_TRUE(bucket0_launched && bucket0.is_completed());
    ASSERT_EQ(l1_grad_defined.size(), 5u);
    EXPECT_EQ(l1_grad_defined[0], 0) << "bucket 0's callback ran only after backward computed l1's gradient";
  });
}

// Communication overlaps backward: bucket 0 (the last layer) is handed to the comm hook
// while the first layer's gradient is still being computed, i.e. before backward finished.
TEST_P(DDP, FirstBucketIsReducedWhileBackwardIsStillRunning) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    {
      auto model = make_mlp(51);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80)));
      at::Tensor first_weight = model->named_parameters()["0.weight"];
      std::vector<int> first_grad_defined_at_launch;
      ddp.register_comm_hook([&](GradBucket& bucket) {
        first_grad_defined_at_launch.push_back(first_weight.grad().defined());
        return all_reduce(bucket.buffer(), ReduceOp::AVG, bucket.process_group(), true);
      });
      for (int step = 0; step < 2; ++step) {
        clear_grads(*model);
        first_grad_defined_at_launch.clear();
        mse(ddp.forward(local.x), local.y).backward();
        ASSERT_EQ(first_grad_defined_at_launch.size(), 3u);
        EXPECT_EQ(first_grad_defined_at_launch[0], 0) << "bucket 0 was launched only after backward computed 0.weight's gradient";
        EXPECT_EQ(first_grad_defined_at_launch[2], 1) << "bucket 2 holds 0.weight itself";
        EXPECT_TRUE(first_weight.grad().defined());
      }
    }
    {
      // With find_unused_parameters, forward through DDP finds `never` (bucket 0) unreachable,
      // so bucket 0 need not wait for the end of backward either.
      auto model = make_branchy(52);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions()
                                             .find_unused_parameters(true)
                                             .bucket_cap_mb(cap_of_floats(80)));
      ASSERT_EQ(ddp.bucket_parameter_names().front().front(), "never.bias");
      std::vector<int> fc1_grad_defined_at_launch;
      ddp.register_comm_hook([&](GradBucket& bucket) {
        fc1_grad_defined_at_launch.push_back(model->fc1->weight.grad().defined());
        return all_reduce(bucket.buffer(), ReduceOp::AVG, bucket.process_group(), true);
      });
      clear_grads(*model);
      mse(ddp.forward(local.x, true), local.y).backward();
      ASSERT_FALSE(fc1_grad_defined_at_launch.empty());
      EXPECT_EQ(fc1_grad_defined_at_launch[0], 0) << "bucket 0 (never.*) waited for the end of backward";
    }
  });
}

TEST_P(DDP, DestroyedDDPNoLongerSynchronizes) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp(61);
    auto local_copy = make_mlp(61);
    { DistributedDataParallel ddp(model); }
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    CommDebugMode comm;
    mse(model->forward(local.x), local.y).backward();
    mse(local_copy->forward(local.x), local.y).backward();
    EXPECT_EQ(comm.get_total_counts(), 0);
    expect_same_gradients(*model, *local_copy, "local");
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(DDP);

TEST_P(DDPMultiRank, ConstructionBroadcastsRankZerosParametersAndBuffers) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto rank0 = [] {
      torch::manual_seed(70);
      return Scaled(1.0f);
    }();
    torch::manual_seed(70 + ctx.rank);
    Scaled model(1.0f + ctx.rank);
    DistributedDataParallel ddp(model);
    expect_same_parameters(*model, *rank0, "after construction");
    expect_close(model->scale, rank0->scale, "buffer scale");
  });
}

TEST_P(DDPMultiRank, BroadcastBuffersMakesEveryRankUseRankZerosBuffersInForward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (bool broadcast_buffers : {true, false}) {
      SCOPED_TRACE(broadcast_buffers ? "broadcast_buffers on" : "broadcast_buffers off");
      torch::manual_seed(80);
      Scaled model(1.0f);
      DistributedDataParallel ddp(model, DistributedDataParallelOptions().broadcast_buffers(broadcast_buffers));
      // Rank-dependent buffers after construction, as a rank-local update (BatchNorm's running stats) makes them.
      model->scale.fill_(10.0f + ctx.rank);
      const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
      at::Tensor out = ddp.forward(local.x);
      const float expected = broadcast_buffers ? 10.0f : 10.0f + ctx.rank;
      EXPECT_TRUE(at::equal(model->scale, at::full({kOut}, expected))) << model->scale;
      torch::NoGradGuard no_grad;
      expect_close(out, model->fc->forward(local.x) * expected, "forward used the broadcast buffer");
    }
  });
}

// The default reduction is asynchronous: with the last rank 1 s late, rank 0's backward still
// gets past bucket 0's launch at once, and only the end of backward waits for the late rank.
TEST_P(DDPMultiRank, DefaultAllReduceIsLaunchedWithoutBlockingBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(48);
    ThreeLayers model;
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(30)));
    // The last rank starts its backward only after rank 0's backward got past launching
    // bucket 0. Were that launch blocking (waiting for the last rank's reduction), rank 0
    // would never get there and the last rank would give up: ordering, not timing.
    const std::string marker = ctx.temp_dir + "/rank0-past-bucket0";
    WaitInBackward::reached = [&] {
      if (ctx.rank == 0) std::ofstream(marker) << "x";
    };
    const Batch local = slice(global_batch(0), ctx.rank, ctx.world_size);
    at::Tensor loss = mse(ddp.forward(local.x), local.y);
    if (ctx.rank == ctx.world_size - 1) {
      for (int i = 0; i < 3000 && !std::filesystem::exists(marker); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ASSERT_TRUE(std::filesystem::exists(marker)) << "launching bucket 0 blocked rank 0's backward";
    }
    loss.backward();
    WaitInBackward::reached = nullptr;
  });
}

INSTANTIATE_TEST_SUITE_P(, DDPMultiRank, ::testing::Values(2, 3, 4), testing::world_size_name);

// ------------------------------------------------------------------------------------------
// Join: uneven inputs (PyTorch's `with ddp_model.join():`). Rank r trains 2 + r iterations on
// batches of its own. The reference is the plain model trained on what join promises the ranks
// still training: at iteration t, the sum of their gradients (each rank's own, computed from
// the same parameters on its batch) divided by the group's size (or, with
// divide_by_initial_world_size(false), by the number of ranks training). A join whose joined
// ranks do not shadow the reductions hangs (the collective timeout fails the test); one that
// shadows them with the wrong collectives, or divides wrongly, ends with other parameters.
// ------------------------------------------------------------------------------------------

class DDPJoin : public testing::WorldSizeTest {};

testing::RunOptions join_run_options() {
  testing::RunOptions options;
  options.deadline = std::chrono::seconds(90);
  options.collective_timeout = std::chrono::milliseconds(20000);
  return options;
}

int iterations_of(int rank) { return 2 + rank; }

// Rank r's micro-batches of iteration t (several when no_sync accumulates some of them).
std::vector<Batch> batches_of(int rank, int t, int micro_batches) {
  std::vector<Batch> out;
  for (int m = 0; m < micro_batches; ++m) out.push_back(global_batch(500 + 100 * rank + 10 * t + m, 4));
  return out;
}

// The gradients (and parameters after each SGD step) join must give the ranks still training.
struct JoinTrajectory {
  std::vector<std::vector<at::Tensor>> grads, params;
};

JoinTrajectory join_reference(uint64_t seed, int world_size, int micro_batches, bool divide_by_initial_world_size) {
  auto reference = make_mlp(seed);
  torch::optim::SGD opt(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  JoinTrajectory out;
  for (int t = 0; t < iterations_of(world_size - 1); ++t) {
    std::vector<at::Tensor> sum;
    for (const auto& p : reference->parameters()) sum.push_back(at::zeros_like(p));
    int training = 0;
    for (int r = 0; r < world_size; ++r) {
      if (t >= iterations_of(r)) continue;
      ++training;
      for (const Batch& b : batches_of(r, t, micro_batches)) {
        clear_grads(*reference);
        mse(reference->forward(b.x), b.y).backward();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += reference->parameters()[i].grad();
      }
    }
    const double divisor = divide_by_initial_world_size ? world_size : training;
    out.grads.emplace_back();
    for (size_t i = 0; i < sum.size(); ++i) {
      out.grads.back().push_back(sum[i] / divisor);
      reference->parameters()[i].mutable_grad() = out.grads.back()[i].clone();
    }
    opt.step();
    out.params.emplace_back();
    for (const auto& p : reference->parameters()) out.params.back().push_back(p.detach().clone());
  }
  return out;
}

void expect_tensors_close(const std::vector<at::Tensor>& actual, const std::vector<at::Tensor>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) expect_close(actual[i], expected[i], what + " #" + std::to_string(i));
}

std::vector<at::Tensor> gradients_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad());
  return out;
}

struct JoinScenario {
  std::string name;
  DistributedDataParallelOptions options;
  bool comm_hook = false;          // a hook that divides by the group's size, then sums
  bool warm_up = false;            // iteration 0 runs before the Join (static_graph records it)
  int micro_batches = 1;           // all but the last of each iteration under no_sync()
  bool divide_by_initial_world_size = true;
};

// Trains with DDP under ddp.join() as `scenario` says and checks every step, the gradients
// every rank holds after the Join (the joined ranks' shadow wrote the last average too) and
// the parameters every rank ends with (the post hook's broadcast: joined ranks did not step).
void train_uneven_under_join(RankContext& ctx, const JoinScenario& scenario) {
  SCOPED_TRACE(scenario.name);
  const uint64_t seed = 300;
  const JoinTrajectory expected = join_reference(seed, ctx.world_size, scenario.micro_batches, scenario.divide_by_initial_world_size);
  auto model = make_mlp(seed);
  DistributedDataParallel ddp(model, scenario.options);
  std::vector<int> hook_calls(ddp.num_buckets(), 0);
  if (scenario.comm_hook)
    ddp.register_comm_hook([&](GradBucket& bucket) {
      ++hook_calls.at(bucket.index());
      bucket.buffer().div_(bucket.process_group().size());
      return all_reduce(bucket.buffer(), ReduceOp::SUM, bucket.process_group(), /*async_op=*/true);
    });
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto iteration = [&](int t) {
    clear_grads(*model);
    const std::vector<Batch> micro = batches_of(ctx.rank, t, scenario.micro_batches);
    for (size_t m = 0; m + 1 < micro.size(); ++m) {
      auto no_sync = ddp.no_sync();
      mse(ddp.forward(micro[m].x), micro[m].y).backward();
    }
    mse(ddp.forward(micro.back().x), micro.back().y).backward();
    expect_tensors_close(gradients_of(*model), expected.grads[t], "gradient at iteration " + std::to_string(t));
    opt.step();
    expect_tensors_close(model->parameters(), expected.params[t], "parameters after iteration " + std::to_string(t));
  };
  int t = 0;
  if (scenario.warm_up) iteration(t++);
  ddp.join([&] {
    for (; t < iterations_of(ctx.rank); ++t) iteration(t);
  }, DistributedDataParallelJoinOptions().divide_by_initial_world_size(scenario.divide_by_initial_world_size));
  const int total = iterations_of(ctx.world_size - 1);
  expect_tensors_close(gradients_of(*model), expected.grads.back(), "gradients after the Join");
  expect_tensors_close(model->parameters(), expected.params.back(), "parameters after the Join");
  if (scenario.comm_hook) {  // the joined ranks ran the hook for the iterations they shadowed
    EXPECT_EQ(hook_calls, std::vector<int>(ddp.num_buckets(), total));
  }
}

TEST_P(DDPJoin, UnevenInputsGiveTheSumOverTrainingRanksDividedByTheWorldSize) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto three_buckets = DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80));
    train_uneven_under_join(ctx, {"default options", DistributedDataParallelOptions()});
    train_uneven_under_join(ctx, {"three buckets, gradient_as_bucket_view, find_unused_parameters",
                                  DistributedDataParallelOptions(three_buckets).gradient_as_bucket_view(true).find_unused_parameters(true)});
    train_uneven_under_join(ctx, {"comm hook", three_buckets, /*comm_hook=*/true});
    train_uneven_under_join(ctx, {"static_graph recorded before the Join", DistributedDataParallelOptions(three_buckets).static_graph(true),
                                  false, /*warm_up=*/true});
  }, join_run_options());
}

TEST_P(DDPJoin, NoSyncUnderJoinAccumulatesLocallyAndJoinedRanksShadowOnlyTheSynchronizedBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    train_uneven_under_join(ctx, {"two micro-batches, the first under no_sync", DistributedDataParallelOptions().bucket_cap_mb(cap_of_floats(80)),
                                  false, false, /*micro_batches=*/2});
  }, join_run_options());
}

TEST_P(DDPJoin, DivideByInitialWorldSizeFalseDividesByTheRanksStillTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    train_uneven_under_join(ctx, {"divide_by_initial_world_size false", DistributedDataParallelOptions(), false, false, 1,
                                  /*divide_by_initial_world_size=*/false});
  }, join_run_options());
}

// DDP in a Join of its own making (fsdpp::Join({&ddp})) is the same as ddp.join().
TEST_P(DDPJoin, DDPPassedToJoinDirectlyShadowsTheSameWay) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const JoinTrajectory expected = join_reference(310, ctx.world_size, 1, true);
    auto model = make_mlp(310);
    DistributedDataParallel ddp(model);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    Join({&ddp}).run([&] {
      for (int t = 0; t < iterations_of(ctx.rank); ++t) {
        clear_grads(*model);
        const Batch b = batches_of(ctx.rank, t, 1)[0];
        mse(ddp.forward(b.x), b.y).backward();
        opt.step();
      }
    });
    expect_tensors_close(model->parameters(), expected.params.back(), "parameters after the Join");
  }, join_run_options());
}

// With rank 0 joined, forward's buffers come from the highest rank still training (as PyTorch).
TEST_P(DDPJoin, BuffersComeFromTheHighestRankStillTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(80);
    Scaled model(1.0f);
    DistributedDataParallel ddp(model);
    model->scale.fill_(10.0f + ctx.rank);  // rank-local buffers, as BatchNorm's running stats
    const float highest = 10.0f + ctx.world_size - 1;
    ddp.join([&] {
      for (int t = 0; t < iterations_of(ctx.rank); ++t) {
        const Batch b = batches_of(ctx.rank, t, 1)[0];
        mse(ddp.forward(b.x), b.y).backward();
        EXPECT_TRUE(at::equal(model->scale, at::full({kOut}, highest + t))) << model->scale;
        model->scale.add_(ctx.rank == ctx.world_size - 1 ? 1.0f : 100.0f);  // only the last rank's updates survive
      }
    });
    const float last = highest + iterations_of(ctx.world_size - 1);  // the post hook's broadcast
    EXPECT_TRUE(at::equal(model->scale, at::full({kOut}, last))) << model->scale;
  }, join_run_options());
}

TEST_P(DDPJoin, ThrowOnEarlyTerminationThrowsOnEveryRank) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp(320);
    DistributedDataParallel ddp(model);
    int iterations = 0;
    const std::string message = error_of([&] {
      ddp.join([&] {
        for (int t = 0; t < iterations_of(ctx.rank); ++t) {
          const Batch b = batches_of(ctx.rank, t, 1)[0];
          mse(ddp.forward(b.x), b.y).backward();
          ++iterations;
        }
      }, DistributedDataParallelJoinOptions().throw_on_early_termination(true));
    });
    EXPECT_NE(message.find("throw_on_early_termination"), std::string::npos) << message;
    EXPECT_EQ(iterations, iterations_of(0));  // every rank stopped when rank 0 ran out
  }, join_run_options());
}

TEST_P(DDPJoin, StaticGraphIsRefusedUntilItsFirstBackwardRecordedTheGraph) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp(330);
    DistributedDataParallel ddp(model, DistributedDataParallelOptions().static_graph(true));
    bool ran = false;
    const std::string message = error_of([&] { ddp.join([&] { ran = true; }); });
    EXPECT_NE(message.find("static_graph under Join"), std::string::npos) << message;
    EXPECT_FALSE(ran);
  }, join_run_options());
}

INSTANTIATE_TEST_SUITE_P(, DDPJoin, ::testing::Values(2, 3, 4), testing::world_size_name);

// Misuse under Join, on one rank (the error comes before any collective could mismatch).
TEST(DDPJoinMisuse, ForwardTwiceBeforeBackwardNoSyncOnlyAroundBackwardAndBackwardWithoutDDPForwardAreErrors) {
  run_ranks(1, [](RankContext&) {
    auto model = make_mlp(340);
    DistributedDataParallel ddp(model);
    const Batch b = batches_of(0, 0, 1)[0];
    std::string twice = error_of([&] {
      ddp.join([&] {
        at::Tensor first = ddp.forward(b.x);
        ddp.forward(b.x);
      });
    });
    EXPECT_NE(twice.find("before the backward of the previous forward"), std::string::npos) << twice;
    std::string no_sync_late = error_of([&] {
      ddp.join([&] {
        at::Tensor loss = mse(ddp.forward(b.x), b.y);
        auto no_sync = ddp.no_sync();
        loss.backward();
      });
    });
    EXPECT_NE(no_sync_late.find("no_sync() must cover the forward"), std::string::npos) << no_sync_late;
    std::string direct = error_of([&] { ddp.join([&] { mse(model->forward(b.x), b.y).backward(); }); });
    EXPECT_NE(direct.find("without a forward through DistributedDataParallel"), std::string::npos) << direct;
    // Outside a Join, all of that is allowed again.
    mse(model->forward(b.x), b.y).backward();
  }, join_run_options());
}

TEST_P(DDPBadInput, ParameterShapeThatDiffersOnOneRankIsAnErrorOnEveryRank) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(90);
    torch::nn::Sequential model(torch::nn::Linear(kIn, kHidden), torch::nn::Linear(kHidden, ctx.rank == 1 ? 5 : kOut));
    std::string message = error_of([&] { DistributedDataParallel ddp(model); });
    EXPECT_NE(message.find("the model differs across the ranks of group world"), std::string::npos) << message;
    EXPECT_NE(message.find("parameter '1.weight' is Float [3, 8] on rank 0 but Float [5, 8] on rank 1"), std::string::npos) << message;
    EXPECT_NE(message.find("parameter '1.bias' is Float [3] on rank 0 but Float [5] on rank 1"), std::string::npos) << message;
    EXPECT_EQ(message.find("'0.weight'"), std::string::npos) << "only differences are named: " << message;
    // The group stays usable.
    at::Tensor t = at::ones({2});
    all_reduce(t);
    EXPECT_TRUE(at::equal(t, at::full({2}, ctx.world_size)));
  });
}

TEST_P(DDPBadInput, ParameterMissingOnOneRankIsAnErrorOnEveryRank) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int last = ctx.world_size - 1;
    torch::nn::Sequential model(torch::nn::Linear(kIn, kHidden));
    if (ctx.rank != last) model->push_back(torch::nn::Linear(kHidden, kOut));
    std::string message = error_of([&] { DistributedDataParallel ddp(model); });
    const std::string on_last = "not on rank " + std::to_string(last);
    EXPECT_NE(message.find("parameter '1.weight' exists on rank 0 but " + on_last), std::string::npos) << message;
    EXPECT_NE(message.find("parameter '1.bias' exists on rank 0 but " + on_last), std::string::npos) << message;
  });
}

TEST_P(DDPBadInput, OptionsThatDifferAcrossRanksAreAnErrorOnEveryRank) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp(1);
    auto options = DistributedDataParallelOptions().find_unused_parameters(ctx.rank == 1);
    std::string message = error_of([&] { DistributedDataParallel ddp(model, options); });
    EXPECT_NE(message.find("find_unused_parameters 0, gradient_as_bucket_view 0, static_graph 0 on rank 0 but "), std::string::npos) << message;
    EXPECT_NE(message.find("find_unused_parameters 1, gradient_as_bucket_view 0, static_graph 0 on rank 1"), std::string::npos) << message;
  });
}

TEST_P(DDPBadInput, ModuleWithoutTrainableParametersIsRejected) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp(1);
    for (auto& p : model->parameters()) p.requires_grad_(false);
    std::string message = error_of([&] { DistributedDataParallel ddp(model); });
    EXPECT_NE(message.find("no parameter that requires a gradient"), std::string::npos) << message;
    message = error_of([&] { DistributedDataParallel ddp(make_mlp(1), DistributedDataParallelOptions().bucket_cap_mb(0)); });
    EXPECT_NE(message.find("bucket_cap_mb must be positive, got 0"), std::string::npos) << message;
  });
}

INSTANTIATE_TEST_SUITE_P(, DDPBadInput, ::testing::Values(2, 3, 4), testing::world_size_name);

}  // namespace
}  // namespace fsdpp

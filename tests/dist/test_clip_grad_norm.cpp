// fsdpp::clip_grad_norm_ (FSDP1's FullyShardedDataParallel.clip_grad_norm_, and
// torch.nn.utils.clip_grad_norm_ over FSDP2's DTensor parameters) against the same model
// unsharded on one process with the global batch, clipped by torch::nn::utils::clip_grad_norm_:
// the total norm, the clipped gradient shards and the parameters after an SGD step (FULL state
// dict) agree, for 1-D FSDP at 1-4 ranks (uneven shards at 3 and 4), HSDP 2 x 2, NO_SHARD,
// SHARD_GRAD_OP, ignored parameters and DDP; plus exact counts that catch replicas or padding
// counted twice, and non-finite gradients.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard_options.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// The total norm agrees with the reference's within 1e-6 relative (about 8 float32 ulps; the
// largest difference measured over these tests is 9.6e-8, under one ulp): the gradients it is
// computed from are sums taken in another order (reduce-scatter / all-reduce instead of one
// process's backward), and it sums |g|^p before one root instead of taking the norm of
// per-parameter norms.
constexpr double kNormRtol = 1e-6;

// LayerNorm(5) (left to the root unit), then three Linear units (auto-wrapped). Odd sizes: at 3
// ranks a 7-row weight is split 3/3/1 and at 4 ranks the (3, 11) weight leaves rank 3 no rows.
Sequential make_plain() {
  torch::manual_seed(7);
  return Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({5})), Linear(5, 7), ReLU(), Linear(7, 11),
                    ReLU(), Linear(11, 3));
}
constexpr int64_t kNumel = 5 + 5 + 7 * 5 + 7 + 11 * 7 + 11 + 3 * 11 + 3;  // 176 elements

FSDPSequential make_fsdp(const FullyShardOptions& options) {
  return fully_shard(make_plain(), FullyShardOptions(options).auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>()));
}

struct ClipCase {
  double norm_type;
  double max_norm;
  bool clips;  // the reference's norm exceeds max_norm (checked)
};
std::string describe(const ClipCase& c) {
  return "norm_type " + (std::isinf(c.norm_type) ? std::string("inf") : std::to_string(static_cast<int>(c.norm_type))) +
         " max_norm " + std::to_string(c.max_norm);
}
const std::vector<ClipCase>& clip_cases() {
  static const std::vector<ClipCase> cases{{2, 0.05, true},  {2, 1e3, false},   {1, 0.05, true},
                                           {1, 1e3, false},  {kInf, 0.01, true}, {kInf, 1e3, false}};
  return cases;
}

// How the model under test holds the parameters: this rank's rows of each (shard_rank of
// shard_size; a full copy is rank 0 of 1), its forward, its values as the plain model's.
struct ModelUnderTest {
  torch::nn::Module* module = nullptr;
  std::function<at::Tensor(const at::Tensor&)> forward;
  std::function<at::Tensor()> clip;  // the call under test
  std::function<std::vector<at::Tensor>()> full_values;
  int shard_rank = 0;
  int shard_size = 1;
  std::function<void()> before_clip;  // e.g. synchronize ignored parameters' gradients
  std::vector<bool> whole;             // per parameter: held whole on every rank (ignored)
};

// Two steps: backward on this rank's slice of the global batch (the reference on all of it),
// clip both, compare the norm and the clipped gradients, SGD step, compare the parameters.
void check_clip_parity(RankContext& ctx, const ModelUnderTest& m, const ClipCase& c, const std::string& label) {
  Sequential ref = make_plain();
  auto ref_params = ref->parameters();
  auto params = m.module->parameters();
  ASSERT_EQ(params.size(), ref_params.size()) << label;
  torch::optim::SGD ref_opt(ref_params, 0.5), opt(params, 0.5);  // plain SGD: clipping shows in the step
  const int64_t local = kGlobalBatch / ctx.world_size;
  for (int step = 0; step < 2; ++step) {
    const std::string where = label + " " + describe(c) + " step " + std::to_string(step);
    ref_opt.zero_grad();
    opt.zero_grad();
    torch::manual_seed(100 + step);
    at::Tensor x = torch::randn({kGlobalBatch, 5});
    at::Tensor y = torch::randn({kGlobalBatch, 3});
    (ref->forward(x) - y).pow(2).mean().backward();
    const double ref_norm = torch::nn::utils::clip_grad_norm_(ref_params, c.max_norm, c.norm_type);
    EXPECT_EQ(ref_norm > c.max_norm, c.clips) << where << ": reference norm " << ref_norm;

    (m.forward(x.narrow(0, ctx.rank * local, local)) - y.narrow(0, ctx.rank * local, local)).pow(2).mean().backward();
    if (m.before_clip) m.before_clip();
    const at::Tensor norm = m.clip();
    ASSERT_EQ(norm.dim(), 0) << where;
    EXPECT_EQ(norm.scalar_type(), at::kFloat) << where;
    EXPECT_NEAR(norm.item<double>(), ref_norm, kNormRtol * ref_norm) << where;
    for (size_t i = 0; i < params.size(); ++i)
      expect_close(params[i].grad(),
                   i < m.whole.size() && m.whole[i] ? ref_params[i].grad()
                                                    : shard_rows(ref_params[i].grad(), m.shard_rank, m.shard_size),
                   where + " clipped grad " + std::to_string(i));
    ref_opt.step();
    opt.step();
    const auto values = m.full_values();
    ASSERT_EQ(values.size(), ref_params.size()) << where;
    for (size_t i = 0; i < values.size(); ++i)
      expect_close(values[i], ref_params[i].detach(), where + " param " + std::to_string(i));
    if (::testing::Test::HasFailure()) return;
  }
}

// The FULL state dict's values under the plain model's keys, in its parameter order.
std::vector<at::Tensor> full_state_dict_values(torch::nn::Module& model) {
  const StateDict sd = get_model_state_dict(model, StateDictOptions().full_state_dict(true));
  std::vector<at::Tensor> out;
  for (const auto& item : make_plain()->named_parameters()) out.push_back(sd.at(item.key()).tensor());
  return out;
}

ModelUnderTest under_test(FSDPSequential& model, int shard_rank, int shard_size, const ClipCase& c) {
  ModelUnderTest m;
  m.module = model.ptr().get();
  m.forward = [model](const at::Tensor& x) mutable { return model->forward(x); };
  m.clip = [model, c] { return clip_grad_norm_(model, c.max_norm, c.norm_type); };
  m.full_values = [model]() mutable { return full_state_dict_values(*model); };
  m.shard_rank = shard_rank;
  m.shard_size = shard_size;
  return m;
}

// Clips FSDP models with options `options` (sharded over shard_size ranks) through every case.
void check_fsdp_cases(RankContext& ctx, const FullyShardOptions& options, int shard_size, const std::string& label) {
  for (const auto& c : clip_cases()) {
    FSDPSequential model = make_fsdp(options);
    check_clip_parity(ctx, under_test(model, ctx.rank % shard_size, shard_size, c), c, label);
    if (::testing::Test::HasFailure()) return;
  }
}

class ClipGradNorm : public testing::WorldSizeTest {};

// Several units, uneven shards at 3 and 4 ranks; norm types 2, 1, inf; a max_norm that clips
// and one that does not.
TEST_P(ClipGradNorm, FsdpMatchesUnshardedNorm) {
  run_ranks(GetParam(), [](RankContext& ctx) { check_fsdp_cases(ctx, FullyShardOptions(), ctx.world_size, "FSDP"); });
}

FSDPP_INSTANTIATE_WORLD_SIZES(ClipGradNorm);

// FSDP1's strategies at 3 ranks: NO_SHARD (every rank the whole model; the replicas' norms
// must not be added up) and SHARD_GRAD_OP (uneven shards).
TEST(ClipGradNormStrategies, NoShardAndShardGradOpMatchUnshardedNorm) {
  run_ranks(3, [](RankContext& ctx) {
    check_fsdp_cases(ctx, FullyShardOptions().sharding_strategy(ShardingStrategy::NO_SHARD), 1, "NO_SHARD");
    check_fsdp_cases(ctx, FullyShardOptions().sharding_strategy(ShardingStrategy::SHARD_GRAD_OP), 3, "SHARD_GRAD_OP");
  });
}

// HSDP on a 2 x 2 mesh: shards reduced over the shard group only, not over the replicas.
TEST(ClipGradNormHsdp, Hsdp2x2MatchesUnshardedNorm) {
  run_ranks(4, [](RankContext& ctx) {
    auto mesh = init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"});
    check_fsdp_cases(ctx, FullyShardOptions().mesh(mesh), 2, "HSDP 2x2");
  });
}

// Ignored parameters (the root's LayerNorm) are whole on every rank and count once. Their
// gradients are each rank's own, so the test averages them first, as a trainer would.
TEST(ClipGradNormIgnored, IgnoredParametersCountOnce) {
  run_ranks(3, [](RankContext& ctx) {
    for (const auto& c : clip_cases()) {
      Sequential plain = make_plain();
      auto norm_layer = plain->ptr<torch::nn::LayerNormImpl>(0);
      std::vector<at::Tensor> ignored{norm_layer->weight, norm_layer->bias};
      FSDPSequential model = fully_shard(
          plain, FullyShardOptions().ignored_params(ignored).auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>()));
      ModelUnderTest m = under_test(model, ctx.rank, ctx.world_size, c);
      m.before_clip = [ignored] {
        for (const auto& p : ignored) all_reduce(p.grad(), ReduceOp::AVG);
      };
      m.whole = {true, true};  // the LayerNorm's weight and bias come first
      check_clip_parity(ctx, m, c, "ignored");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// DDP (replicate): gradients are equal on every rank, clipping is local and equals the reference.
TEST(ClipGradNormDdp, DdpMatchesUnshardedNorm) {
  run_ranks(3, [](RankContext& ctx) {
    for (const auto& c : clip_cases()) {
      auto ddp = replicate(make_plain());
      ModelUnderTest m;
      m.module = ddp.module().get();
      m.forward = [&ddp](const at::Tensor& x) { return ddp.forward(x); };
      m.clip = [&ddp, c] { return clip_grad_norm_(ddp, c.max_norm, c.norm_type); };
      m.full_values = [&ddp] {
        std::vector<at::Tensor> out;
        for (const auto& p : ddp.module()->parameters()) out.push_back(p.detach());
        return out;
      };
      check_clip_parity(ctx, m, c, "DDP");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// A plain module: the same as torch::nn::utils::clip_grad_norm_ (norm and gradients), any p.
TEST(ClipGradNormPlain, PlainModuleEqualsTorchClipGradNorm) {
  for (double p : {2.0, 1.0, kInf, 3.0}) {
    for (double max_norm : {0.05, 1e3}) {
      Sequential ref = make_plain(), model = make_plain();
      torch::manual_seed(5);
      at::Tensor x = torch::randn({kGlobalBatch, 5}), y = torch::randn({kGlobalBatch, 3});
      (ref->forward(x) - y).pow(2).mean().backward();
      (model->forward(x) - y).pow(2).mean().backward();
      const double expected = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm, p);
      const at::Tensor norm = clip_grad_norm_(model, max_norm, p);
      const std::string where = "p " + std::to_string(p) + " max_norm " + std::to_string(max_norm);
      EXPECT_NEAR(norm.item<double>(), expected, kNormRtol * expected) << where;
      for (size_t i = 0; i < ref->parameters().size(); ++i)
        expect_close(model->parameters()[i].grad(), ref->parameters()[i].grad(), where + " grad " + std::to_string(i));
    }
  }
  // The norm's dtype: float32 for bf16 gradients (accumulated in float32), float64 for float64.
  for (auto dtype : {at::kBFloat16, at::kDouble}) {
    Sequential model = make_plain();
    model->to(dtype);
    (model->forward(torch::randn({kGlobalBatch, 5}, dtype)).sum()).backward();
    at::Tensor sum = at::zeros({}, at::kDouble);
    for (const auto& p : model->parameters()) sum += p.grad().to(at::kDouble).square().sum();
    const double expected = std::sqrt(sum.item<double>());
    const at::Tensor norm = clip_grad_norm_(model, 1e3);
    EXPECT_EQ(norm.scalar_type(), dtype == at::kDouble ? at::kDouble : at::kFloat) << dtype;
    EXPECT_NEAR(norm.item<double>(), expected, (dtype == at::kDouble ? 1e-12 : kNormRtol) * expected) << dtype;
  }
  Sequential model = make_plain();
  EXPECT_EQ(clip_grad_norm_(model, 1.0).item<double>(), 0.0) << "no gradients: the norm is 0";
  for (double bad : {0.0, -1.0, -kInf, std::nan("")})
    EXPECT_NE(testing::error_of([&] { clip_grad_norm_(model, 1.0, bad); }).find("norm_type must be positive"),
              std::string::npos)
        << bad;
}

// The sum of squares of this rank's gradients in float64, summed over the world (the test's own
// reduction): the squared 2-norm of gradients that no two ranks hold in common.
double world_sum_of_squares(torch::nn::Module& model) {
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (const auto& p : model.parameters())
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).square().sum();
  all_reduce(sum, ReduceOp::SUM);
  return sum.item<double>();
}

// bf16 compute: `.grad` of the sharded parameters is float32 (their dtype), the norm is computed
// and returned in float32, and clipping scales the shards on every rank.
TEST(ClipGradNormMixedPrecision, Bf16ComputeNormIsFloat32OverTheShards) {
  run_ranks(2, [](RankContext& ctx) {
    FSDPSequential model =
        make_fsdp(FullyShardOptions().mp_policy(MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat)));
    torch::manual_seed(11);
    at::Tensor x = torch::randn({kGlobalBatch, 5}), y = torch::randn({kGlobalBatch, 3});
    const int64_t local = kGlobalBatch / ctx.world_size;
    (model->forward(x.narrow(0, ctx.rank * local, local)).to(at::kFloat) - y.narrow(0, ctx.rank * local, local))
        .pow(2)
        .mean()
        .backward();
    for (const auto& p : model->parameters()) ASSERT_EQ(p.grad().scalar_type(), at::kFloat);
    const double expected = std::sqrt(world_sum_of_squares(*model));
    const at::Tensor norm = clip_grad_norm_(model, expected / 2);
    EXPECT_EQ(norm.scalar_type(), at::kFloat);
    EXPECT_NEAR(norm.item<double>(), expected, kNormRtol * expected);
    EXPECT_NEAR(std::sqrt(world_sum_of_squares(*model)), expected / 2, 1e-5 * expected);
  });
}

// Every gradient element 1: the 1-norm is exactly the model's element count, the 2-norm its
// square root, the inf-norm 1, whatever the layout. Counting an HSDP or NO_SHARD replica twice,
// an ignored parameter once per rank, or padding rows would change these numbers.
TEST(ClipGradNormCounting, ReplicasAndPaddingAreNotCounted) {
  run_ranks(4, [](RankContext& ctx) {
    auto mesh = init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"});
    struct Layout {
      std::string name;
      FullyShardOptions options;
      bool ignore_norm_layer;
    };
    const std::vector<Layout> layouts{
        {"FSDP over 4 (rank 3 holds no rows of the last weight)", FullyShardOptions(), false},
        {"HSDP 2x2", FullyShardOptions().mesh(mesh), false},
        {"NO_SHARD", FullyShardOptions().sharding_strategy(ShardingStrategy::NO_SHARD), false},
        {"FSDP over 4, LayerNorm ignored", FullyShardOptions(), true},
        {"HSDP 2x2, LayerNorm ignored", FullyShardOptions().mesh(mesh), true},
    };
    for (const auto& layout : layouts) {
      Sequential plain = make_plain();
      auto norm_layer = plain->ptr<torch::nn::LayerNormImpl>(0);
      FullyShardOptions options = FullyShardOptions(layout.options).auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>());
      if (layout.ignore_norm_layer) options.ignored_params({norm_layer->weight, norm_layer->bias});
      FSDPSequential model = fully_shard(plain, options);
      auto set_ones = [&] {
        for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
      };
      set_ones();
      EXPECT_EQ(clip_grad_norm_(model, 1e9, 1.0).item<double>(), static_cast<double>(kNumel)) << layout.name;
      set_ones();
      EXPECT_FLOAT_EQ(clip_grad_norm_(model, 1e9, 2.0).item<float>(), std::sqrt(static_cast<float>(kNumel)))
          << layout.name;
      set_ones();
      EXPECT_EQ(clip_grad_norm_(model, 1e9, kInf).item<double>(), 1.0) << layout.name;
      // Clipping to half the 1-norm halves every gradient element on every rank.
      set_ones();
      clip_grad_norm_(model, kNumel / 2.0, 1.0);
      for (auto& p : model->parameters()) {
        if (p.numel() > 0) {
          EXPECT_EQ(p.grad().max().item<double>(), 0.5) << layout.name;
          EXPECT_EQ(p.grad().min().item<double>(), 0.5) << layout.name;
        }
      }
    }
  });
}

// A NaN (or inf) gradient in one rank's shard: with error_if_nonfinite every rank throws (after
// the reduction, so no rank is left waiting), naming the parameter on the rank that holds it,
// and no gradient is scaled; without it the norm is NaN (inf) on every rank, as in PyTorch.
TEST(ClipGradNormNonfinite, NonfiniteGradientIsAnErrorOnEveryRank) {
  run_ranks(2, [](RankContext& ctx) {
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), kInf}) {
      for (double p : {2.0, 1.0, kInf}) {
        const std::string where = "bad " + std::to_string(bad) + " p " + std::to_string(p);
        FSDPSequential model = make_fsdp(FullyShardOptions());
        torch::manual_seed(3);
        (model->forward(torch::randn({3, 5})).sum()).backward();
        // Rank 1 holds rows 4-6 of the (7, 5) weight of Linear(5, 7), "1.weight".
        at::Tensor grad = model->parameters()[2].grad();
        ASSERT_EQ(grad.size(0), ctx.rank == 0 ? 4 : 3);
        if (ctx.rank == 1) grad.view(-1)[0].fill_(bad);
        std::vector<at::Tensor> before;
        for (auto& q : model->parameters()) before.push_back(q.grad().clone());
        const std::string error = testing::error_of([&] { clip_grad_norm_(model, 1.0, p, true); });
        EXPECT_NE(error.find(std::string("is non-finite (") + (std::isnan(bad) ? "nan" : "inf") + "), so it cannot be clipped"),
                  std::string::npos)
            << where << ": " << error;
        EXPECT_NE(error.find("error_if_nonfinite = false"), std::string::npos) << where << ": " << error;
        const char* expected = ctx.rank == 1 ? "non-finite gradient on this rank: '1.weight'" : "in another rank's shard";
        EXPECT_NE(error.find(expected), std::string::npos) << where << ": " << error;
        for (size_t i = 0; i < before.size(); ++i)
          EXPECT_TRUE(at::equal(model->parameters()[i].grad().nan_to_num(), before[i].nan_to_num())) << where << " grad " << i;

        const double norm = clip_grad_norm_(model, 1.0, p).item<double>();
        EXPECT_TRUE(std::isnan(bad) ? std::isnan(norm) : std::isinf(norm) && norm > 0) << where << ": " << norm;
      }
    }
  });
}

}  // namespace
}  // namespace fsdpp

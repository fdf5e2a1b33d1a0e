// Tensor parallelism (parallelize_module with ColwiseParallel / RowwiseParallel) against the plain
// model trained in one process on the same data, at TP sizes 1-4: hidden sizes 3, 16 and 17 cover
// an even split, torch.chunk's uneven one and a rank holding nothing (3 at 4 ranks).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include <fsdpp/tensor_parallel.h>

#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::RankContext;
using testing::run_ranks;
using torch::nn::Embedding;
using torch::nn::Linear;
using torch::nn::ReLU;
using torch::nn::Sequential;

constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-5;

class TensorParallelTest : public testing::WorldSizeTest {};

// The full value of a TP parameter (or gradient: undefined counts as zeros), gathered by its layout.
at::Tensor full_of(const at::Tensor& local, const TensorLayout& layout) {
  const int rank = layout.process_group().rank();
  at::Tensor t = local.defined() ? local.detach() : torch::zeros(layout.local_shape(rank));
  return layout.to_sharded_tensor(t.contiguous(), /*copy=*/true).full_tensor();
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, kRtol, kAtol))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

// Parameters (and with `grads`, their gradients) of the TP model, gathered, against the reference's.
void expect_same_parameters(torch::nn::Module& tp, torch::nn::Module& ref, bool grads, const std::string& when) {
  std::map<std::string, TensorParallelParameter> layouts;
  for (auto& p : tensor_parallel_parameters(tp)) layouts.emplace(p.name, p);
  const auto tp_params = tp.named_parameters();
  for (const auto& item : ref.named_parameters()) {
    ASSERT_TRUE(tp_params.contains(item.key())) << item.key();
    const at::Tensor& mine = tp_params[item.key()];
    const at::Tensor local = grads ? mine.grad() : mine;
    const auto it = layouts.find(item.key());
    const at::Tensor full = it == layouts.end() ? local.detach() : full_of(local, it->second.layout);
    const at::Tensor expected = grads ? item.value().grad() : item.value();
    expect_close(full, expected.detach(), when + (grads ? " grad of " : " ") + item.key());
  }
}

using MakeModel = std::function<std::shared_ptr<torch::nn::Module>()>;
using Forward = std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)>;

// Steps of the TP model and the plain one on the same (replicated) batches: outputs, losses,
// gathered gradients and parameters after each optimizer step match.
void train_against_reference(RankContext& ctx, const MakeModel& make, const ParallelizePlan& plan,
                             const std::function<at::Tensor()>& make_input, const Forward& forward, bool adam) {
  torch::manual_seed(0);
  auto ref = make();
  torch::manual_seed(0);
  auto tp = make();
  parallelize_module(*tp, ctx.world, plan);
  auto optimizer = [&](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    if (adam) return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2));
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
  };
  auto ref_opt = optimizer(*ref), tp_opt = optimizer(*tp);
  for (int step = 0; step < 3; ++step) {
    const std::string when = std::string(adam ? "Adam" : "SGD") + " step " + std::to_string(step);
    torch::manual_seed(100 + step);  // the same batch on every rank
    const at::Tensor x = make_input();
    const at::Tensor ref_out = forward(*ref, x), tp_out = forward(*tp, x);
    expect_close(tp_out, ref_out.detach(), when + " output");
    const at::Tensor target = torch::randn(ref_out.sizes());
    const at::Tensor ref_loss = (ref_out - target).pow(2).mean(), tp_loss = (tp_out - target).pow(2).mean();
    expect_close(tp_loss, ref_loss.detach(), when + " loss");
    ref_opt->zero_grad();
    tp_opt->zero_grad();
    ref_loss.backward();
    tp_loss.backward();
    expect_same_parameters(*tp, *ref, /*grads=*/true, when);
    ref_opt->step();
    tp_opt->step();
    expect_same_parameters(*tp, *ref, /*grads=*/false, when + " after the update");
  }
}

at::Tensor sequential_forward(torch::nn::Module& m, const at::Tensor& x) {
  return dynamic_cast<torch::nn::SequentialImpl&>(m).forward(x);
}

// Megatron's MLP: column-parallel in, row-parallel out; activations between them stay sharded.
TEST_P(TensorParallelTest, MegatronMlpInSequentialMatchesLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const int64_t hidden : {3, 16, 17})
      for (const bool adam : {false, true}) {
        SCOPED_TRACE("hidden " + std::to_string(hidden));
        train_against_reference(
            ctx, [&] { return Sequential(Linear(5, hidden), ReLU(), Linear(hidden, 7)).ptr(); },
            {{"0", ColwiseParallel()}, {"2", RowwiseParallel()}}, [] { return torch::randn({4, 5}); },
            sequential_forward, adam);
      }
  });
}

// The non-default layouts: a colwise output all-gathered, a rowwise input replicated.
TEST_P(TensorParallelTest, ReplicatedColwiseOutputAndRowwiseInputMatchLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const int64_t hidden : {3, 17}) {
      SCOPED_TRACE("hidden " + std::to_string(hidden));
      train_against_reference(
          ctx, [&] { return Sequential(Linear(5, hidden), ReLU(), Linear(hidden, 6)).ptr(); },
          {{"0", ColwiseParallel().output_layouts(TPLayout::Replicate)},
           {"2", RowwiseParallel().input_layouts(TPLayout::Replicate)}},
          [] { return torch::randn({2, 3, 5}); }, sequential_forward, /*adam=*/true);
    }
  });
}

// Embedding: row-wise (masked lookup + all-reduce) feeding a Megatron MLP, and column-wise
// feeding a row-wise Linear.
TEST_P(TensorParallelTest, EmbeddingsMatchLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto ids = [] { return torch::randint(0, 11, {4, 3}, torch::kLong); };
    for (const int64_t dim : {3, 17}) {
      SCOPED_TRACE("dim " + std::to_string(dim));
      train_against_reference(
          ctx, [&] { return Sequential(Embedding(11, 6), Linear(6, dim), ReLU(), Linear(dim, 5)).ptr(); },
          {{"0", RowwiseParallel()}, {"1", ColwiseParallel()}, {"3", RowwiseParallel()}}, ids, sequential_forward,
          /*adam=*/true);
      train_against_reference(
          ctx, [&] { return Sequential(Embedding(torch::nn::EmbeddingOptions(11, dim).padding_idx(2)), Linear(dim, 5)).ptr(); },
          {{"0", ColwiseParallel()}, {"1", RowwiseParallel()}}, ids, sequential_forward, /*adam=*/false);
    }
  });
}

// A block whose forward calls its layers through typed members, declared as the wrapper.
template <typename L>
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t hidden) {
    fc1 = register_module("fc1", L(Linear(5, hidden)));
    fc2 = register_module("fc2", L(Linear(hidden, 4)));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  L fc1{nullptr}, fc2{nullptr};
};
using PlainBlock = BlockImpl<Linear>;
using TPBlock = BlockImpl<TensorParallel<torch::nn::LinearImpl>>;

TEST_P(TensorParallelTest, TypedMembersDeclaredAsTheWrapperMatchLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    auto ref = std::make_shared<PlainBlock>(17);
    torch::manual_seed(0);
    auto tp = std::make_shared<TPBlock>(17);
    EXPECT_EQ(tp->named_parameters().keys(), ref->named_parameters().keys());  // the plain model's names
    parallelize_module(*tp, ctx.world, {{"fc1", ColwiseParallel()}, {"fc2", RowwiseParallel()}});
    EXPECT_EQ(tp->fc1->module()->weight.sizes().vec(), TensorLayout({17, 5}, Placement::shard(0), ctx.world).local_shape(ctx.rank));
    EXPECT_EQ(tp->fc2->tp_parameters().at(0).layout.placements().at(0), Placement::shard(1));
    const at::Tensor x = torch::randn({3, 5});
    const at::Tensor ref_out = ref->forward(x), tp_out = tp->forward(x);
    expect_close(tp_out, ref_out.detach(), "output");
    ref_out.sum().backward();
    tp_out.sum().backward();
    expect_same_parameters(*tp, *ref, /*grads=*/true, "typed members");
  });
}

// A block with a plain typed member: it cannot be wrapped.
struct PlainMemberImpl : torch::nn::Module {
  PlainMemberImpl() { fc = register_module("fc", Linear(4, 4)); }
  Linear fc{nullptr};
};

TEST(TensorParallel, MisuseIsAnErrorNamingTheModuleAndLeavesTheModelAsItWas) {
  run_ranks(2, [](RankContext& ctx) {
    Sequential seq(Linear(4, 6), ReLU(), Linear(6, 4));
    EXPECT_NE(error_of([&] { parallelize_module(*seq, ctx.world, {{"0", ColwiseParallel()}, {"7", RowwiseParallel()}}); })
                  .find("the plan's '7' names no submodule of torch::nn::SequentialImpl (its submodules: '0', '1', '2')"),
              std::string::npos);
    EXPECT_NE(dynamic_cast<torch::nn::LinearImpl*>(seq[0].get()), nullptr) << "the model was changed";
    EXPECT_NE(error_of([&] { parallelize_module(*seq, ctx.world, {{"1", ColwiseParallel()}}); })
                  .find("the plan's '1' is a torch::nn::ReLUImpl; ColwiseParallel and RowwiseParallel apply to "
                        "torch::nn::Linear and torch::nn::Embedding"),
              std::string::npos);
    PlainMemberImpl plain;
    EXPECT_NE(error_of([&] { parallelize_module(plain, ctx.world, {{"fc", ColwiseParallel()}}); })
                  .find("the plan's 'fc' (torch::nn::LinearImpl) is held by the root"),
              std::string::npos);
    EXPECT_NE(error_of([&] { parallelize_module(plain, ctx.world, {{"fc", ColwiseParallel()}}); })
                  .find("declare that member as fsdpp::TensorParallel<torch::nn::LinearImpl>"),
              std::string::npos);
    parallelize_module(*seq, ctx.world, {{"0", ColwiseParallel()}});
    EXPECT_NE(error_of([&] { parallelize_module(*seq, ctx.world, {{"0", RowwiseParallel()}}); })
                  .find("the plan's '0' is already parallelized"),
              std::string::npos);
    // A row-wise layer given the whole input instead of its shard.
    parallelize_module(*seq, ctx.world, {{"2", RowwiseParallel()}});
    auto* row = dynamic_cast<TensorParallelModule*>(seq[2].get());
    ASSERT_NE(row, nullptr);
    EXPECT_NE(error_of([&] { row->forward(torch::randn({2, 6})); })
                  .find("TensorParallel '2' (RowwiseParallel): its input [2, 6] should hold this rank's 3 of 6 in-features"),
              std::string::npos);
    const DeviceMesh mesh2d = init_device_mesh(ctx.world, {1, 2}, {"dp", "tp"});
    EXPECT_NE(error_of([&] { parallelize_module(*seq, mesh2d, {}); }).find("the TP mesh must be 1-D"), std::string::npos);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(TensorParallelTest);

}  // namespace
}  // namespace fsdpp

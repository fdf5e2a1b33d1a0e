// Tensor parallelism (parallelize_module with ColwiseParallel / RowwiseParallel, and sequence
// parallelism: SequenceParallel, Shard(1) layouts, PrepareModuleInput) against the plain model
// trained in one process on the same data, at TP sizes 1-4: hidden sizes 3, 16 and 17 and
// sequence lengths 8, 5 and 3 cover an even split, torch.chunk's uneven one and a rank holding
// nothing (3 at 4 ranks).
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include <torch/torch.h>

#include <fsdpp/collectives.h>
#include <fsdpp/tensor_parallel.h>

#include "dist/world_sizes.h"
#include "tp_transformer.h"
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
constexpr double kGradAtol = 1e-6;  // the transformer's gradients: many are below 1e-5

class TensorParallelTest : public testing::WorldSizeTest {};

// The full value of a TP parameter (or gradient: undefined counts as zeros), gathered by its layout.
at::Tensor full_of(const at::Tensor& local, const TensorLayout& layout) {
  const int rank = layout.process_group().rank();
  at::Tensor t = local.defined() ? local.detach() : torch::zeros(layout.local_shape(rank));
  return layout.to_sharded_tensor(t.contiguous(), /*copy=*/true).full_tensor();
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double atol = kAtol) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(torch::allclose(actual, expected, kRtol, atol))
      << what << ": max difference " << (actual - expected).abs().max().item<double>();
}

// Parameters (and with `grads`, their gradients) of the TP model, gathered, against the reference's.
void expect_same_parameters(torch::nn::Module& tp, torch::nn::Module& ref, bool grads, const std::string& when,
                            double atol = kAtol) {
  std::map<std::string, TensorParallelParameter> layouts;
  for (auto& p : tensor_parallel_parameters(tp)) layouts.emplace(p.name, p);
  const auto tp_params = tp.named_parameters();
  for (const auto& item : ref.named_parameters()) {
    ASSERT_TRUE(tp_params.contains(item.key())) << item.key();
    const at::Tensor& mine = tp_params[item.key()];
    const at::Tensor local = grads ? mine.grad() : mine;
    const auto it = layouts.find(item.key());
    const bool replicated = it == layouts.end() || it->second.layout.placements().at(0).is_replicate();
    const at::Tensor full = replicated ? local.detach() : full_of(local, it->second.layout);
    const at::Tensor expected = grads ? item.value().grad() : item.value();
    expect_close(full, expected.detach(), when + (grads ? " grad of " : " ") + item.key(), atol);
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

// PyTorch's ColwiseParallel redistributes its Shard(-1) output to any output_layouts; Shard of a
// leading dim (an all-to-all) is refused, for an Embedding as for a Linear, not ignored.
TEST(TensorParallel, ColwiseOutputShardedAlongALeadingDimIsAnErrorNamingTheModule) {
  run_ranks(2, [](RankContext& ctx) {
    Sequential seq(Linear(4, 6), Embedding(5, 6));
    const ColwiseParallel style = ColwiseParallel().output_layouts(TPLayout::shard(0));
    parallelize_module(*seq, ctx.world, {{"0", style}, {"1", style}});
    const std::string refused =
        " (ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))): the output is sharded along its "
        "last dim (the features) or replicated";
    EXPECT_NE(error_of([&] { seq[0]->as<TensorParallelModule>()->forward(torch::randn({3, 4})); })
                  .find("TensorParallel '0'" + refused),
              std::string::npos);
    EXPECT_NE(error_of([&] { seq[1]->as<TensorParallelModule>()->forward(torch::tensor({1, 4, 2})); })
                  .find("TensorParallel '1'" + refused),
              std::string::npos);
  });
}

// Sequence parallelism in a Sequential (its LayerNorm wrapped in place): a row-wise Linear
// reduce-scatters along the sequence (its bias's gradient all-reduced), the norm runs on its rows,
// a column-wise Linear all-gathers them; and a row-wise Embedding scattering along the sequence.
TEST_P(TensorParallelTest, SequenceShardedLayoutsInSequentialMatchLocalTraining) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const TPLayout seq = TPLayout::shard(1);
    for (const int64_t s : {8, 5, 3}) {
      SCOPED_TRACE("sequence " + std::to_string(s));
      train_against_reference(
          ctx,
          [] {
            return Sequential(Linear(5, 17), ReLU(), Linear(17, 6), torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})),
                              Linear(6, 7))
                .ptr();
          },
          {{"0", ColwiseParallel()},
           {"2", RowwiseParallel().output_layouts(seq)},
           {"3", SequenceParallel()},
           {"4", ColwiseParallel().input_layouts(seq).output_layouts(TPLayout::Replicate)}},
          [s] { return torch::randn({2, s, 5}); }, sequential_forward, /*adam=*/true);
      train_against_reference(
          ctx,
          [] {
            return Sequential(Embedding(11, 6), torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})), Linear(6, 5)).ptr();
          },
          {{"0", RowwiseParallel().input_layouts(TPLayout::Replicate).output_layouts(seq)},
           {"1", SequenceParallel()},
           {"2", ColwiseParallel().input_layouts(seq).output_layouts(TPLayout::Replicate)}},
          [s] { return torch::randint(0, 11, {3, s}, torch::kLong); }, sequential_forward, /*adam=*/false);
    }
  });
}

// Heads of 2 so that every TP size 1-4 splits the 24 columns of q/k/v into whole heads; a vocab of
// 13 splits unevenly.
examples::TransformerArgs transformer_args() {
  examples::TransformerArgs args;
  args.n_layers = 2;
  args.vocab_size = 13;
  args.max_seq_len = 8;
  args.dim = 24;
  args.n_heads = 12;
  return args;
}

// Every rank's gradient of each replicated TP parameter (the SequenceParallel norms) is bitwise
// the same: clip_grad_norm_ and the optimizers rely on it.
void expect_replicated_grads_identical(torch::nn::Module& tp, const ProcessGroup& group, const std::string& when) {
  int checked = 0;
  for (const auto& p : tensor_parallel_parameters(tp)) {
    if (!p.layout.placements().at(0).is_replicate()) continue;
    const at::Tensor g = p.param.grad().contiguous();
    at::Tensor all = torch::empty({group.size(), g.numel()});
    all_gather_into_tensor(all, g.reshape({-1}), group);
    for (int r = 0; r < group.size(); ++r)
      EXPECT_TRUE(all[r].equal(g.reshape({-1}))) << when << " grad of " << p.name << " differs on TP rank " << r;
    ++checked;
  }
  EXPECT_GT(checked, 0) << when;
}

// PyTorch's Transformer.parallelize with and without use_seq_parallel against the plain
// transformer (examples/transformer.h, the same values), sequence lengths 8, 5 and 3.
void train_transformer_against_reference(RankContext& ctx, bool use_seq_parallel, int64_t seq, bool adam) {
  const examples::TransformerArgs args = transformer_args();
  torch::manual_seed(0);
  examples::Transformer ref(args);
  examples::TPTransformer tp(args);
  {
    torch::NoGradGuard no_grad;
    const auto ref_params = ref->named_parameters();
    for (auto& item : tp->named_parameters()) item.value().copy_(ref_params[item.key()]);
  }
  parallelize_module(*tp, ctx.world, examples::tp_transformer_plan(args.n_layers, use_seq_parallel));
  // Adam's eps 1e-4: with the default 1e-8 its first step turns the float32 roundoff (~1e-10) of
  // gradients that are zero in exact arithmetic (the causal attention's first key) into +-lr; 1e-4
  // bounds that amplification (lr / eps) to 100.
  const auto optimizer = [&](torch::nn::Module& m) -> std::unique_ptr<torch::optim::Optimizer> {
    if (adam) return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(1e-2).eps(1e-4));
    return std::make_unique<torch::optim::SGD>(m.parameters(), torch::optim::SGDOptions(0.1));
  };
  auto ref_opt = optimizer(*ref), tp_opt = optimizer(*tp);
  for (int step = 0; step < 2; ++step) {
    const std::string when = std::string(use_seq_parallel ? "SP " : "TP ") + (adam ? "Adam" : "SGD") +
                             " sequence " + std::to_string(seq) + " step " + std::to_string(step);
    torch::manual_seed(100 + step);
    const at::Tensor tokens = torch::randint(args.vocab_size, {2, seq}, torch::kLong);
    const at::Tensor targets = torch::randint(args.vocab_size, {2, seq}, torch::kLong);
    const at::Tensor ref_out = ref->forward(tokens), tp_out = tp->forward(tokens);
    expect_close(tp_out, ref_out.detach(), when + " output");
    const at::Tensor ref_loss = examples::language_model_loss(ref_out, targets);
    const at::Tensor tp_loss = examples::language_model_loss(tp_out, targets);
    expect_close(tp_loss, ref_loss.detach(), when + " loss");
    ref_opt->zero_grad();
    tp_opt->zero_grad();
    ref_loss.backward();
    tp_loss.backward();
    expect_same_parameters(*tp, *ref, /*grads=*/true, when, kGradAtol);
    if (use_seq_parallel) expect_replicated_grads_identical(*tp, ctx.world, when);
    ref_opt->step();
    tp_opt->step();
    expect_same_parameters(*tp, *ref, /*grads=*/false, when + " after the update");
    if (::testing::Test::HasFailure()) return;
  }
}

// Not the whole use_seq_parallel x sequence x optimizer product of three steps (12 runs per TP
// size took about 60 s at TP sizes 1-4): two steps of sequence parallelism at each length, SGD at
// 5 and Adam at the others, and of the plan without it once (the 2-D transformer tests train it
// too).
TEST_P(TensorParallelTest, SequenceParallelTransformerMatchesLocalTraining) {
  struct Case {
    bool use_seq_parallel;
    int64_t seq;
    bool adam;
  };
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (const Case& c : {Case{true, 8, true}, Case{true, 5, false}, Case{true, 3, true}, Case{false, 5, true}}) {
      train_transformer_against_reference(ctx, c.use_seq_parallel, c.seq, c.adam);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

TEST(TensorParallel, SequenceParallelMisuseIsAnErrorNamingTheModule) {
  run_ranks(2, [](RankContext& ctx) {
    const TPLayout seq = TPLayout::shard(1);
    Sequential seq_model(Linear(4, 6), ReLU(), torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})), Embedding(5, 6));
    const auto error = [&](const ParallelizePlan& plan) { return error_of([&] { parallelize_module(*seq_model, ctx.world, plan); }); };
    EXPECT_NE(error({{"2", SequenceParallel()}, {"0", SequenceParallel()}})
                  .find("the plan's '0' is a torch::nn::LinearImpl; SequenceParallel applies to torch::nn::LayerNorm"),
              std::string::npos);
    EXPECT_NE(dynamic_cast<torch::nn::LayerNormImpl*>(seq_model[2].get()), nullptr) << "the model was changed";
    EXPECT_NE(error({{"2", ColwiseParallel()}})
                  .find("the plan's '2' is a torch::nn::LayerNormImpl; ColwiseParallel and RowwiseParallel apply to"),
              std::string::npos);
    EXPECT_NE(error({{"3", ColwiseParallel().input_layouts(seq)}})
                  .find("the plan's '3' (ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))): an "
                        "Embedding's ids are replicated"),
              std::string::npos);
    EXPECT_NE(error({{"0", RowwiseParallel().output_layouts(TPLayout::ShardLastDim)}})
                  .find("the plan's '0' (RowwiseParallel(input_layouts=Shard(-1), output_layouts=Shard(-1))): the "
                        "output's last dim (the out features) cannot be sharded"),
              std::string::npos);
    EXPECT_NE(error({{"1", PrepareModuleInput().input_layouts(seq).desired_input_layouts(TPLayout::shard(0))}})
                  .find("the plan's '1' (PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Shard(0))): "
                        "redistributing between two Shard layouts (an all-to-all) is not supported"),
              std::string::npos);
    EXPECT_NE(error({{"1", PrepareModuleInput().input_layouts(seq)}})
                  .find("the plan's '1' is a plain torch::nn::ReLUImpl: parallelize_module puts wrappers in place of "
                        "Linear, Embedding and LayerNorm elements of a Sequential or ModuleList only; declare it as "
                        "fsdpp::TensorParallel<torch::nn::ReLUImpl>"),
              std::string::npos);
    // At forward: a norm whose sequence dim is normalized; sequence parts that are not torch.chunk's.
    parallelize_module(*seq_model, ctx.world,
                       {{"2", SequenceParallel().sequence_dim(-1)}, {"0", ColwiseParallel().input_layouts(seq)}});
    auto* norm = dynamic_cast<TensorParallelModule*>(seq_model[2].get());
    ASSERT_NE(norm, nullptr);
    EXPECT_NE(error_of([&] { norm->forward(torch::randn({2, 3, 6})); })
                  .find("TensorParallel '2' (SequenceParallel(sequence_dim=-1)): the sequence dim -1 of its input "
                        "[2, 3, 6] is among the 1 normalized dims [6]"),
              std::string::npos);
    auto* col = dynamic_cast<TensorParallelModule*>(seq_model[0].get());
    ASSERT_NE(col, nullptr);
    // 5 rows split 2 + 3 instead of torch.chunk's 3 + 2.
    EXPECT_NE(error_of([&] { col->forward(torch::randn({1, ctx.rank == 0 ? 2 : 3, 4})); })
                  .find("TensorParallel '0' (ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1))): the "
                        "TP ranks hold [2, 3] slices of dim 1"),
              std::string::npos);
    // The transformer's attention is declared as the wrapper; a typed member that is not is named.
    examples::TransformerArgs args = transformer_args();
    examples::Transformer plain(args);
    EXPECT_NE(error_of([&] { parallelize_module(*plain, ctx.world, {{"layers.0.attention_norm", SequenceParallel()}}); })
                  .find("declare that member as fsdpp::TensorParallel<torch::nn::LayerNormImpl>"),
              std::string::npos);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(TensorParallelTest);

}  // namespace
}  // namespace fsdpp

// ZeroRedundancyOptimizer: seed 004 (PyTorch's test_zero_redundancy_optimizer.py) on CPU ranks
// at world sizes 1-4. Test names follow the seed's (test_state_dict -> StateDict).
#include <gtest/gtest.h>

#include <sstream>

#include <torch/torch.h>

#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "compat/optimizer_state_key.h"
#include "dist/world_sizes.h"
#include "dist/zero_suite.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

// An optimizer that derives directly from torch::optim::Optimizer and only specialises
// fsdpp::OptimizerTraits: its state has a tensor, an int64 and a double field.
namespace custom_optim {

struct CountingOptions : torch::optim::OptimizerCloneableOptions<CountingOptions> {
  CountingOptions(double lr = 0.1) : lr_(lr) {}  // NOLINT: implicit like libtorch's options
  TORCH_ARG(double, lr);

 public:
  void serialize(torch::serialize::OutputArchive& archive) const override { _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr); }
  void serialize(torch::serialize::InputArchive& archive) override { _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr); }
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct CountingParamState : torch::optim::OptimizerCloneableParamState<CountingParamState> {
  TORCH_ARG(int64_t, steps) = 0;
  TORCH_ARG(double, scale) = 1.0;
  TORCH_ARG(torch::Tensor, total);

 public:
  void serialize(torch::serialize::OutputArchive& archive) const override {
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(steps);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(scale);
    _TORCH_OPTIM_SERIALIZE_TORCH_ARG(total);
  }
  void serialize(torch::serialize::InputArchive& archive) override {
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, steps);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, scale);
    _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, total);
  }
};

// p -= lr * scale * (sum of all gradients so far); scale halves every step.
class Counting : public torch::optim::Optimizer {
 public:
  Counting(std::vector<torch::optim::OptimizerParamGroup> groups, CountingOptions defaults)
      : Optimizer(std::move(groups), std::make_unique<CountingOptions>(defaults)) {}
  Counting(std::vector<torch::Tensor> params, CountingOptions defaults)
      : Counting({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) loss = closure();
    for (auto& group : param_groups()) {
      const double lr = static_cast<const CountingOptions&>(group.options()).lr();
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state()[fsdpp::compat::optimizer_state_key(p)];
        if (!slot) {
          auto fresh = std::make_unique<CountingParamState>();
          fresh->total(torch::zeros_like(p));
          slot = std::move(fresh);
        }
        auto& st = static_cast<CountingParamState&>(*slot);
        st.steps(st.steps() + 1);
        st.total().add_(p.grad());
        p.sub_(st.total() * (lr * st.scale()));
        st.scale(st.scale() / 2);
      }
    }
    return loss;
  }
  // libtorch's base Optimizer saves and loads nothing: each optimizer names its types.
  void save(torch::serialize::OutputArchive& archive) const override {
    torch::optim::serialize<CountingParamState, CountingOptions>(archive, *this);
  }
  void load(torch::serialize::InputArchive& archive) override {
    torch::optim::serialize<CountingParamState, CountingOptions>(archive, *this);
  }
};

}  // namespace custom_optim

template <>
struct fsdpp::OptimizerTraits<custom_optim::Counting> {
  using Options = custom_optim::CountingOptions;
  using ParamState = custom_optim::CountingParamState;
};

namespace zero_test {
namespace {

using fsdpp::testing::RankContext;
using fsdpp::testing::run_ranks;
using torch::optim::OptimizerParamGroup;
using torch::optim::OptimizerOptions;
using LossClosure = torch::optim::Optimizer::LossClosure;

template <typename O>
using ZeRO = fsdpp::ZeroRedundancyOptimizer<O>;

using fsdpp::testing::error_of;

auto key_of(const torch::Tensor& p) { return fsdpp::compat::optimizer_state_key(p); }

torch::Tensor scalar_param(double value) {
  return torch::tensor({value}, torch::TensorOptions().dtype(torch::kFloat).requires_grad(true));
}

bool same(const torch::Tensor& a, const torch::Tensor& b, double rtol = 1e-5, double atol = 1e-6) {
  return a.sizes() == b.sizes() && torch::allclose(a, b, rtol, atol);
}

// A stack of Linear layers; the same seed gives the same weights on every rank.
torch::nn::Sequential make_mlp(const std::vector<int64_t>& dims, uint64_t seed) {
  torch::manual_seed(seed);
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < dims.size(); ++i) model->push_back(torch::nn::Linear(dims[i], dims[i + 1]));
  return model;
}

std::vector<torch::Tensor> weights_of(torch::nn::Sequential& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->named_parameters())
    if (p.key().find("weight") != std::string::npos) out.push_back(p.value());
  return out;
}
std::vector<torch::Tensor> biases_of(torch::nn::Sequential& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m->named_parameters())
    if (p.key().find("bias") != std::string::npos) out.push_back(p.value());
  return out;
}

void expect_same_params(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const std::string& what,
                        double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same(a[i], b[i], rtol, atol)) << what << ": parameter " << i << " differs:\n" << a[i] << "\n" << b[i];
}

// Sets every gradient to None (PyTorch 2's zero_grad, whatever the libtorch's zero_grad does).
void set_grads_to_none(torch::optim::Optimizer& o) {
  for (auto& g : o.param_groups())
    for (auto& p : g.params()) p.mutable_grad().reset();
}

// What DDP does to gradients: average them over the ranks (in one flat all_reduce).
void average_grads(const std::vector<torch::Tensor>& params, int world_size) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  std::vector<torch::Tensor> flat_views;
  for (const auto& g : grads) flat_views.push_back(g.reshape({-1}));
  torch::Tensor flat = torch::cat(flat_views);
  fsdpp::all_reduce(flat);
  flat.div_(world_size);
  int64_t offset = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()).view(g.sizes()));
    offset += g.numel();
  }
}

// Consolidates on group rank `to` and hands the state dict to every rank.
template <typename O>
fsdpp::OptimizerStateDict consolidated_everywhere(ZeRO<O>& zero, int to) {
  zero.consolidate_state_dict(to);
  std::string bytes;
  if (zero.rank() == to) bytes = zero.state_dict().to_bytes();
  fsdpp::broadcast_bytes(bytes, zero.process_group().global_rank(to), zero.process_group());
  return zero.state_dict_from_bytes(bytes);
}

// Parameter i's state entries in a positional state dict.
const fsdpp::StateDict& state_of(const fsdpp::OptimizerStateDict& sd, int64_t i) { return sd.state.at(std::to_string(i)); }

// The same entries with equal tensors (what AdamParamState's operator== compares).
bool same_state(const fsdpp::StateDict& a, const fsdpp::StateDict& b) {
  if (a.keys() != b.keys()) return false;
  for (const auto& [name, value] : a)
    if (!torch::equal(value.tensor(), b.at(name).tensor())) return false;
  return true;
}

std::string save_plain(const torch::optim::Optimizer& o) {
  std::ostringstream out;
  torch::save(o, out);
  return out.str();
}
void load_plain(torch::optim::Optimizer& o, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::load(o, in);
}

// ------------------------------------------------------------------------------------------
// Single-rank scenarios of the seed, run at every world size.
// ------------------------------------------------------------------------------------------

TEST_P(ZeroRedundancyOptimizer, StateDict) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const double LR1 = 0.1, LR2 = 0.01, MOMENTUM = 0.9;
    const int RECIPIENT_RANK = ctx.world_size - 1;  // the seed's only rank is 0; also try another
    torch::Tensor x = scalar_param(1.0);
    ZeRO<torch::optim::SGD> o({x}, torch::optim::SGDOptions(LR1).momentum(MOMENTUM));
    ASSERT_EQ(o.param_owners(), std::vector<int>{0});
    const bool owner = ctx.rank == 0;
    x.backward();
    o.step();
    EXPECT_TRUE(torch::equal(x, torch::tensor({0.9f}))) << x;
    if (owner) {
      auto& st = static_cast<torch::optim::SGDParamState&>(*o.optim().state().at(key_of(x)));
      EXPECT_TRUE(torch::equal(st.momentum_buffer(), torch::tensor({1.0f})));
    } else {
      EXPECT_TRUE(o.optim().state().empty()) << "a rank that owns nothing keeps state";
    }

    o.zero_grad();
    o.consolidate_state_dict(RECIPIENT_RANK);
    if (ctx.rank == RECIPIENT_RANK) {
      fsdpp::OptimizerStateDict sd = o.state_dict();
      ASSERT_EQ(sd.param_groups.size(), 1u);
      EXPECT_EQ(sd.param_groups[0].params, std::vector<std::string>{"0"});
      const auto& opts = static_cast<const torch::optim::SGDOptions&>(*sd.param_groups[0].options);
      EXPECT_EQ(opts.lr(), 0.1);
      EXPECT_EQ(opts.momentum(), 0.9);
      EXPECT_FALSE(opts.nesterov());
      EXPECT_EQ(opts.weight_decay(), 0.0);
      EXPECT_EQ(opts.dampening(), 0.0);
      // The state dict's options and param_groups() agree.
      EXPECT_TRUE(opts == static_cast<const torch::optim::SGDOptions&>(o.param_groups()[0].options()));
      ASSERT_EQ(sd.state.size(), 1u);
      EXPECT_TRUE(torch::equal(state_of(sd, 0).at("momentum_buffer").tensor(),
                               torch::tensor({1.0f})));
    } else {
      std::string m = error_of([&] { o.state_dict(); });
      EXPECT_NE(m.find("holds no consolidated optimizer state; call consolidate_state_dict(to)"), std::string::npos) << m;
    }
    fsdpp::OptimizerStateDict state_dict = consolidated_everywhere(o, RECIPIENT_RANK);

    // Reload into an optimizer made with another lr: the loaded lr wins.
    ZeRO<torch::optim::SGD> o2({x}, torch::optim::SGDOptions(LR2));
    o2.load_state_dict(state_dict);
    if (owner) {
      auto& st = static_cast<torch::optim::SGDParamState&>(*o2.optim().state().at(key_of(x)));
      EXPECT_TRUE(torch::equal(st.momentum_buffer(), torch::tensor({1.0f})));
    }
    EXPECT_EQ(o2.param_groups()[0].options().get_lr(), LR1);
    EXPECT_EQ(static_cast<torch::optim::SGDOptions&>(o2.param_groups()[0].options()).momentum(), MOMENTUM);
    x.backward();
    o2.step();
    EXPECT_TRUE(torch::allclose(x, torch::tensor({0.71f}))) << x;
    if (owner) {
      auto& st = static_cast<torch::optim::SGDParamState&>(*o2.optim().state().at(key_of(x)));
      EXPECT_TRUE(torch::allclose(st.momentum_buffer(), torch::tensor({1.9f}))) << st.momentum_buffer();
    }
    EXPECT_EQ(o2.param_groups()[0].params()[0].device(), x.device());
  });
}

// The consolidated state goes stale with the next step; `to` must be a rank of the group.
TEST_P(ZeroRedundancyOptimizer, StateDictErrors) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::Tensor x = scalar_param(1.0);
    ZeRO<torch::optim::SGD> o({x}, torch::optim::SGDOptions(0.1).momentum(0.9));
    std::string m = error_of([&] { o.state_dict(); });
    EXPECT_NE(m.find("rank " + std::to_string(ctx.rank) + " of process group world holds no consolidated"), std::string::npos) << m;
    m = error_of([&] { o.consolidate_state_dict(ctx.world_size); });
    EXPECT_NE(m.find("to=" + std::to_string(ctx.world_size) + " is not a rank of process group world"), std::string::npos) << m;
    x.backward();
    o.step();
    o.consolidate_state_dict(0);
    if (ctx.rank == 0) {
      EXPECT_EQ(o.state_dict().state.size(), 1u);
    }
    o.step();
    m = error_of([&] { o.state_dict(); });
    if (ctx.rank == 0)
      EXPECT_NE(m.find("is stale (step() ran after consolidate_state_dict())"), std::string::npos) << m;
    else
      EXPECT_NE(m.find("holds no consolidated"), std::string::npos) << m;
    // torch::save needs a consolidated state too.
    std::ostringstream out;
    m = error_of([&] { torch::save(o, out); });
    EXPECT_NE(m.find("state_dict()"), std::string::npos) << m;
  });
}

// The consolidated state dict is libtorch's optimizer layout: a plain libtorch optimizer loads
// it (torch::load), and ZeRO loads what a plain one saved (torch::save), both ways exact.
TEST_P(ZeroRedundancyOptimizer, StateDictLibtorchLayout) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto zero_model = make_mlp({3, 4, 2}, 7);
    auto plain_model = make_mlp({3, 4, 2}, 7);
    ZeRO<torch::optim::Adam> zero(zero_model->parameters(), torch::optim::AdamOptions(0.01));
    torch::optim::Adam plain(plain_model->parameters(), torch::optim::AdamOptions(0.01));
    torch::manual_seed(1);  // the same inputs on every rank: no gradient averaging needed
    for (int i = 0; i < 3; ++i) {
      torch::Tensor input = torch::randn({5, 3});
      zero.zero_grad();
      zero_model->forward(input).square().sum().backward();
      zero.step();
      set_grads_to_none(plain);
      plain_model->forward(input).square().sum().backward();
      plain.step();
    }
    expect_same_params(zero_model->parameters(), plain_model->parameters(), "after training");
    fsdpp::OptimizerStateDict sd = consolidated_everywhere(zero, 0);
    fsdpp::OptimizerStateDict reference = fsdpp::OptimizerStateDict::from_optimizer(plain);
    if (ctx.rank == 0) {  // torch::save(zero, ...) on the consolidating rank: a plain Adam loads it
      std::ostringstream out;
      torch::save(zero, out);
      auto m = make_mlp({3, 4, 2}, 7);
      torch::optim::Adam from_file(m->parameters(), torch::optim::AdamOptions(0.01));
      load_plain(from_file, out.str());
      const fsdpp::OptimizerStateDict from_file_sd = fsdpp::OptimizerStateDict::from_optimizer(from_file);
      for (int64_t i = 0; i < 4; ++i)
        EXPECT_TRUE(same_state(state_of(from_file_sd, i), state_of(reference, i))) << "torch::save(zero): parameter " << i;
    }
    ASSERT_EQ(sd.state.size(), 4u);
    ASSERT_EQ(reference.state.size(), 4u);
    for (int64_t i = 0; i < 4; ++i) {
      const fsdpp::StateDict& a = state_of(sd, i);
      EXPECT_EQ(a.at("step").tensor().item<int64_t>(), 3);
      EXPECT_TRUE(same_state(a, state_of(reference, i))) << "state of parameter " << i << " differs from the plain optimizer's";
    }

    // ZeRO -> plain libtorch optimizer, through libtorch's own loader.
    auto other_model = make_mlp({3, 4, 2}, 7);
    torch::optim::Adam loaded(other_model->parameters(), torch::optim::AdamOptions(0.01));
    load_plain(loaded, sd.to_bytes());
    auto params = other_model->parameters();
    const fsdpp::OptimizerStateDict loaded_sd = fsdpp::OptimizerStateDict::from_optimizer(loaded);
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_TRUE(same_state(state_of(loaded_sd, i), state_of(reference, i))) << "parameter " << i;

    // Plain libtorch optimizer -> ZeRO (torch::load into ZeRO reads torch::save's archive).
    auto resumed_model = make_mlp({3, 4, 2}, 7);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) resumed_model->parameters()[i].copy_(plain_model->parameters()[i]);
    }
    ZeRO<torch::optim::Adam> resumed(resumed_model->parameters(), torch::optim::AdamOptions(0.5));
    {
      std::istringstream in(save_plain(plain));
      torch::load(resumed, in);
    }
    EXPECT_EQ(resumed.param_groups()[0].options().get_lr(), 0.01) << "the loaded lr wins";
    for (int i = 0; i < 2; ++i) {
      torch::Tensor input = torch::randn({5, 3});
      resumed.zero_grad();
      resumed_model->forward(input).square().sum().backward();
      resumed.step();
      set_grads_to_none(plain);
      plain_model->forward(input).square().sum().backward();
      plain.step();
    }
    expect_same_params(resumed_model->parameters(), plain_model->parameters(), "after resuming from a plain checkpoint");
  });
}

// A state dict saved at one world size loads at another: here from the world into a ZeRO on a
// sub-group of the other ranks (group rank != global rank), continuing like a plain optimizer.
TEST_P(ZeroRedundancyOptimizer, LoadStateDictAtAnyRankCount) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    auto model = make_mlp({4, 6, 3}, 3);
    auto plain_model = make_mlp({4, 6, 3}, 3);
    ZeRO<torch::optim::Adam> zero(model->parameters(), torch::optim::AdamOptions(0.02));
    torch::optim::Adam plain(plain_model->parameters(), torch::optim::AdamOptions(0.02));
    torch::manual_seed(5);
    auto train = [&](torch::nn::Sequential& m, torch::optim::Optimizer& o, const torch::Tensor& input, bool zero_grad_none) {
      if (zero_grad_none) set_grads_to_none(o);
      m->forward(input).tanh().sum().backward();
      o.step();
    };
    for (int i = 0; i < 3; ++i) {
      torch::Tensor input = torch::randn({4, 4});
      zero.zero_grad();
      train(model, zero, input, false);
      train(plain_model, plain, input, true);
    }
    fsdpp::OptimizerStateDict sd = consolidated_everywhere(zero, 0);

    std::vector<int> others;
    for (int r = (n > 1 ? 1 : 0); r < n; ++r) others.push_back(r);
    fsdpp::ProcessGroup sub = ctx.world.new_group(others);
    std::vector<torch::Tensor> inputs;
    for (int i = 0; i < 3; ++i) inputs.push_back(torch::randn({4, 4}));
    for (const auto& input : inputs) train(plain_model, plain, input, true);
    if (!sub.is_member()) return;
    EXPECT_EQ(sub.size(), n > 1 ? n - 1 : 1);

    auto resumed_model = make_mlp({4, 6, 3}, 3);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < model->parameters().size(); ++i) resumed_model->parameters()[i].copy_(model->parameters()[i]);
    }
    ZeRO<torch::optim::Adam> resumed(resumed_model->parameters(), torch::optim::AdamOptions(0.9), sub);
    resumed.load_state_dict(sd);
    EXPECT_EQ(resumed.param_groups()[0].options().get_lr(), 0.02);
    int64_t local_states = static_cast<int64_t>(resumed.optim().state().size()), total = local_states;
    torch::Tensor t = torch::tensor({total});
    fsdpp::all_reduce(t, fsdpp::ReduceOp::SUM, sub);
    EXPECT_EQ(t.item<int64_t>(), 4) << "every parameter's state lands on exactly one rank of the sub-group";
    for (const auto& input : inputs) {
      resumed.zero_grad();
      train(resumed_model, resumed, input, false);
    }
    expect_same_params(resumed_model->parameters(), plain_model->parameters(), "after resuming on the sub-group");
  });
}

TEST_P(ZeroRedundancyOptimizer, LrScheduler) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int NUM_ITERS = 5;
    const double LR = 0.01;
    torch::Tensor x = scalar_param(1.0), x2 = scalar_param(1.0);
    ZeRO<torch::optim::SGD> o({x}, torch::optim::SGDOptions(LR));
    torch::optim::SGD o2({x2}, torch::optim::SGDOptions(LR));
    torch::optim::StepLR s(o, 1, 0.5);
    torch::optim::StepLR s2(o2, 1, 0.5);
    for (int i = 0; i < NUM_ITERS; ++i) {
      // (The seed zeroes the gradients between backward and step, so its steps do nothing;
      // here they do.)
      o.zero_grad();
      x.backward();
      o.step();
      s.step();
      set_grads_to_none(o2);
      x2.backward();
      o2.step();
      s2.step();
      EXPECT_TRUE(torch::equal(x, x2)) << "iteration " << i << ": " << x << " vs " << x2;
      EXPECT_EQ(o.param_groups()[0].options().get_lr(), o2.param_groups()[0].options().get_lr());
    }
    EXPECT_LT(x.item<float>(), 1.0f - 0.015f) << "the steps did not move x by the scheduled amounts";
    (void)ctx;
  });
}

// C++ has no **kwargs: step(closure, extra arguments...) forwards them to the wrapped
// optimizer's own step overload.
class SGDWithStepKWArg : public torch::optim::SGD {
 public:
  using SGD::SGD;
  using SGD::step;
  torch::Tensor step(LossClosure closure, std::vector<int>& kwarg) {
    torch::Tensor loss = SGD::step(std::move(closure));
    kwarg.push_back(5);
    return loss;
  }
};

TEST_P(ZeroRedundancyOptimizer, StepWithKwargs) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    std::vector<int> kwarg;
    torch::Tensor x = scalar_param(1.0);
    ZeRO<SGDWithStepKWArg> o({x}, torch::optim::SGDOptions(0.1));
    x.backward();
    o.step(nullptr, kwarg);
    EXPECT_EQ(kwarg, std::vector<int>{5});
    EXPECT_TRUE(torch::allclose(x, torch::tensor({0.9f}))) << x;
    (void)ctx;
  });
}

// The seed's optimizer adds a key to its param group during step. In libtorch a group's options
// are a typed object: this optimizer swaps in a richer options type carrying `new_key`, and
// ZeRO's param_groups() must show it; option changes made on ZeRO's side still reach it.
struct SGDNewKeyOptions : torch::optim::SGDOptions {
  explicit SGDNewKeyOptions(const torch::optim::SGDOptions& o) : SGDOptions(o) {}
  std::unique_ptr<OptimizerOptions> clone() const override { return std::make_unique<SGDNewKeyOptions>(*this); }
  double new_key = 0;
};

class SGDWithNewKey : public torch::optim::SGD {
 public:
  using SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::Tensor loss = SGD::step(std::move(closure));
    auto options = std::make_unique<SGDNewKeyOptions>(static_cast<torch::optim::SGDOptions&>(param_groups()[0].options()));
    options->new_key = 0.1;
    param_groups()[0].set_options(std::move(options));
    return loss;
  }
};

TEST_P(ZeroRedundancyOptimizer, StepWithExtraInnerKey) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::Tensor x = scalar_param(1.0);
    ZeRO<SGDWithNewKey> o({x}, torch::optim::SGDOptions(0.1));
    x.backward();
    o.step();
    auto* options = dynamic_cast<SGDNewKeyOptions*>(&o.param_groups()[0].options());
    ASSERT_NE(options, nullptr) << "ZeRO's param group does not show the wrapped optimizer's new key";
    EXPECT_EQ(options->new_key, 0.1);
    EXPECT_TRUE(torch::allclose(x, torch::tensor({0.9f}))) << x;
    // An lr set on ZeRO's group still drives the next step.
    o.param_groups()[0].options().set_lr(0.2);
    o.step();
    EXPECT_TRUE(torch::allclose(x, torch::tensor({0.7f}))) << x;
    (void)ctx;
  });
}

// In libtorch every optimizer's step takes a closure; this one insists on getting none.
class SGDWithoutClosure : public torch::optim::SGD {
 public:
  using SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override {
    if (closure) throw std::runtime_error("SGDWithoutClosure got a closure");
    return SGD::step();
  }
};

TEST_P(ZeroRedundancyOptimizer, StepWithoutClosure) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::Tensor x = scalar_param(1.0);
    ZeRO<SGDWithoutClosure> o({x}, torch::optim::SGDOptions(0.1));
    x.backward();
    o.step();
    EXPECT_TRUE(torch::allclose(x, torch::tensor({0.9f}))) << x;
    (void)ctx;
  });
}

TEST_P(ZeroRedundancyOptimizer, ZeroGrad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::Tensor x = torch::rand({1}) + 0.5;
    torch::nn::Linear m(1, 1);
    ZeRO<torch::optim::SGD> o(m->parameters(), torch::optim::SGDOptions(0.01));
    m->forward(x).backward(x);
    ASSERT_TRUE(m->weight.grad().defined());
    EXPECT_FALSE(torch::equal(m->weight.grad(), torch::zeros_like(m->weight)));
    EXPECT_FALSE(torch::equal(m->bias.grad(), torch::zeros_like(m->bias)));
    o.zero_grad(/*set_to_none=*/false);
    EXPECT_TRUE(torch::equal(m->weight.grad(), torch::zeros_like(m->weight)));
    EXPECT_TRUE(torch::equal(m->bias.grad(), torch::zeros_like(m->bias)));
    o.zero_grad();
    EXPECT_FALSE(m->weight.grad().defined()) << "zero_grad() must reset every gradient, not just this rank's partition";
    EXPECT_FALSE(m->bias.grad().defined());
    (void)ctx;
  });
}

TEST_P(ZeroRedundancyOptimizer, Constructor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const double LR = 0.01;
    auto m = make_mlp({5, 10, 10, 10}, 0);
    using SGDZ = ZeRO<torch::optim::SGD>;
    const torch::optim::SGDOptions sgd(LR);
    // Empty parameters.
    std::string e = error_of([&] { SGDZ z(std::vector<torch::Tensor>{}, sgd); });
    EXPECT_NE(e.find("did not receive any parameters"), std::string::npos) << e;
    e = error_of([&] { SGDZ z(std::vector<OptimizerParamGroup>{OptimizerParamGroup({}), OptimizerParamGroup({})}, sgd); });
    EXPECT_NE(e.find("did not receive any parameters"), std::string::npos) << e;
    // An invalid element (the seed's `list(params) + [42]`): an undefined tensor.
    auto with_invalid = m->parameters();
    with_invalid.push_back(torch::Tensor());
    e = error_of([&] { SGDZ z(with_invalid, sgd); });
    EXPECT_NE(e.find("parameter 6 (group 0) is an undefined tensor"), std::string::npos) << e;
    // A non-leaf tensor.
    auto non_leaf = m->parameters();
    non_leaf[2] = non_leaf[2] * 2;
    e = error_of([&] { SGDZ z(non_leaf, sgd); });
    EXPECT_NE(e.find("parameter 2 (group 0) is not a leaf tensor"), std::string::npos) << e;
    // A parameter twice.
    e = error_of([&] { SGDZ z({OptimizerParamGroup(weights_of(m)), OptimizerParamGroup({biases_of(m)[0], weights_of(m)[1]})}, sgd); });
    EXPECT_NE(e.find("parameter 4 is the same tensor as parameter 1"), std::string::npos) << e;
    // Group options of another optimizer.
    e = error_of([&] {
      SGDZ z({OptimizerParamGroup(weights_of(m), std::make_unique<torch::optim::AdamOptions>(0.1))}, sgd);
    });
    EXPECT_NE(e.find("parameter group 0 has options of type torch::optim::AdamOptions, expected torch::optim::SGDOptions"),
              std::string::npos)
        << e;
    // Valid inputs: groups, a parameter list.
    SGDZ groups({OptimizerParamGroup(weights_of(m)), OptimizerParamGroup(biases_of(m))}, sgd);
    EXPECT_EQ(groups.param_groups().size(), 2u);
    SGDZ list(m->parameters(), sgd);
    EXPECT_EQ(list.param_groups().size(), 1u);
    EXPECT_EQ(list.params().size(), 6u);

    // Multiple groups with their own options.
    const double WD = 0.01;
    auto weights_options = torch::optim::AdamWOptions(LR).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.0);
    auto biases_options = torch::optim::AdamWOptions(LR).betas({0.9, 0.999}).eps(1e-8).weight_decay(WD);
    ZeRO<torch::optim::AdamW> o({OptimizerParamGroup(weights_of(m), std::make_unique<torch::optim::AdamWOptions>(weights_options)),
                                 OptimizerParamGroup(biases_of(m), std::make_unique<torch::optim::AdamWOptions>(biases_options))},
                                torch::optim::AdamWOptions(LR));
    ASSERT_EQ(o.param_groups().size(), 2u) << "Expected 2 ZeRO param groups";
    ASSERT_EQ(o.optim().param_groups().size(), 2u) << "Expected 2 local optimizer param groups";
    EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(o.optim().param_groups()[1].options()).weight_decay(), WD);
    EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(o.optim().param_groups()[0].options()).weight_decay(), 0.0);

    // A process that is not a member of the group.
    fsdpp::ProcessGroup first_only = ctx.world.new_group({0});
    if (ctx.rank != 0) {
      e = error_of([&] { SGDZ z(m->parameters(), sgd, first_only); });
      EXPECT_NE(e.find("not a member of process group"), std::string::npos) << e;
    }
  });
}

TEST_P(ZeroRedundancyOptimizer, SameDenseParamType) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    using SGDZ = ZeRO<torch::optim::SGD>;
    const torch::optim::SGDOptions sgd(0.01);
    auto sparse = [] { return torch::sparse_coo_tensor({2, 3}, torch::kFloat); };
    std::string e = error_of([&] { SGDZ z({sparse()}, sgd); });
    EXPECT_NE(e.find("only supports dense parameters of one type: parameter 0 (group 0) has layout Sparse"), std::string::npos) << e;
    e = error_of([&] { SGDZ z({torch::empty({1}, torch::kFloat), torch::empty({1}, torch::kDouble)}, sgd); });
    EXPECT_NE(e.find("same dense type for all parameters: parameter 0 (group 0) is Float, parameter 1 (group 0) is Double"),
              std::string::npos)
        << e;
    e = error_of([&] { SGDZ z({torch::empty({1}), torch::empty({1}), sparse()}, sgd); });
    EXPECT_NE(e.find("parameter 2 (group 0) has layout Sparse"), std::string::npos) << e;
    // add_param_group checks the new group against the existing parameters.
    SGDZ o({torch::empty({1})}, sgd);
    e = error_of([&] { o.add_param_group(OptimizerParamGroup({torch::empty({2}, torch::kDouble)})); });
    EXPECT_NE(e.find("parameter 0 is Float, parameter 1 (group 1) is Double"), std::string::npos) << e;
    EXPECT_EQ(o.param_groups().size(), 1u) << "a rejected group was added";
    (void)ctx;
  });
}

// ------------------------------------------------------------------------------------------
// Distributed scenarios.
// ------------------------------------------------------------------------------------------

TEST_P(ZeroRedundancyOptimizer, Step) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const double LR = 0.01;
    torch::Tensor x = torch::tensor({float(ctx.rank + 1)});
    torch::nn::Linear m(1, 1), m_zero(1, 1);
    {
      torch::NoGradGuard no_grad;
      for (auto* l : {&m, &m_zero}) {
        (*l)->weight.fill_(1.0);
        (*l)->bias.fill_(2.0);
      }
    }
    torch::optim::SGD o(m->parameters(), torch::optim::SGDOptions(LR));
    ZeRO<torch::optim::SGD> o_zero(m_zero->parameters(), torch::optim::SGDOptions(LR));
    m->forward(x).backward(x);
    m_zero->forward(x).backward(x);
    average_grads(m->parameters(), ctx.world_size);
    o.step();
    average_grads(m_zero->parameters(), ctx.world_size);
    o_zero.step();
    EXPECT_TRUE(torch::equal(m->weight, m_zero->weight)) << m->weight << m_zero->weight;
    EXPECT_TRUE(torch::equal(m->bias, m_zero->bias)) << m->bias << m_zero->bias;
    EXPECT_FALSE(torch::equal(m->weight, torch::ones({1, 1}))) << "the step did nothing";
  });
}

TEST_P(ZeroRedundancyOptimizer, StepWithClosure) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (bool bucket_view : {false, true}) {
      SCOPED_TRACE(bucket_view ? "parameters_as_bucket_view" : "per-parameter broadcasts");
      const float x_val = ctx.rank + 1, weight = 1.0, bias = 2.0, error = 1.0;
      torch::Tensor target = torch::tensor({x_val * weight + bias + error});
      torch::nn::L1Loss loss_fn;
      torch::Tensor x = torch::tensor({x_val});
      torch::nn::Linear m(1, 1);
      {
        torch::NoGradGuard no_grad;
        m->weight.fill_(weight);
        m->bias.fill_(bias);
      }
      ZeRO<torch::optim::SGD> o(m->parameters(), torch::optim::SGDOptions(0.1), {}, bucket_view);
      m->forward(x).backward(x);
      average_grads(m->parameters(), ctx.world_size);
      auto closure = [&] {
        o.zero_grad();
        torch::Tensor loss = loss_fn(m->forward(x), target);
        loss.backward();
        return loss;
      };
      torch::Tensor loss = o.step(closure);
      EXPECT_TRUE(torch::equal(loss, torch::tensor(error))) << loss;
      // Rank 0 owns the weight (x = 1), the last rank the bias.
      EXPECT_TRUE(torch::allclose(m->weight, torch::tensor({{1.1f}}))) << m->weight;
      EXPECT_TRUE(torch::allclose(m->bias, torch::tensor({2.1f}))) << m->bias;
    }
  });
}

TEST_P(ZeroRedundancyOptimizer, Sharding) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    const std::vector<int64_t> sizes = {9, 7, 5, 3};
    std::vector<torch::Tensor> params;
    for (int r = 0; r < n; ++r)
      for (int64_t s : sizes) params.push_back(torch::rand({s, 1}));
    ZeRO<torch::optim::SGD> o(params, torch::optim::SGDOptions(0.01));
    int64_t local = 0;
    std::vector<int64_t> local_sizes;
    for (const auto& p : o.optim().param_groups()[0].params()) {
      local += p.numel();
      local_sizes.push_back(p.numel());
    }
    EXPECT_EQ(local, 9 + 7 + 5 + 3);
    EXPECT_EQ(local_sizes, sizes) << "each rank owns one parameter of each size, largest first";

    // Sorted-greedy by hand: sizes 3, 10, 4, 4, 1 (ties keep their order; ties between ranks
    // go to the lowest rank).
    std::vector<torch::Tensor> q;
    for (int64_t s : {3, 10, 4, 4, 1}) q.push_back(torch::rand({s}));
    ZeRO<torch::optim::SGD> o2(q, torch::optim::SGDOptions(0.01));
    const std::map<int, std::vector<int>> expected_owners = {
        {1, {0, 0, 0, 0, 0}}, {2, {1, 0, 1, 1, 0}}, {3, {1, 0, 1, 2, 2}}, {4, {3, 0, 1, 2, 3}}};
    const std::map<int, std::vector<std::vector<int64_t>>> expected_partition = {
        {1, {{1, 2, 3, 0, 4}}}, {2, {{1, 4}, {2, 3, 0}}}, {3, {{1}, {2, 0}, {3, 4}}}, {4, {{1}, {2}, {3}, {0, 4}}}};
    EXPECT_EQ(o2.param_owners(), expected_owners.at(n));
    EXPECT_EQ(o2.partition(), expected_partition.at(n));
    // The wrapped optimizer holds exactly this rank's tensors, in that order.
    const auto& mine = o2.optim().param_groups()[0].params();
    ASSERT_EQ(mine.size(), expected_partition.at(n)[ctx.rank].size());
    for (size_t i = 0; i < mine.size(); ++i)
      EXPECT_TRUE(mine[i].is_same(q[expected_partition.at(n)[ctx.rank][i]])) << "local parameter " << i;
  });
}

TEST_P(ZeroRedundancyOptimizer, AddParamGroup) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    const double LR = 0.01;
    {  // all trainable
      std::vector<int64_t> sizes_world;
      for (int r = 0; r < n; ++r)
        for (int64_t s : {9, 7, 5, 3}) sizes_world.push_back(s);
      std::vector<torch::Tensor> params;
      for (size_t i = 0; i + 1 < sizes_world.size(); ++i) params.push_back(torch::rand({sizes_world[i], 1}).requires_grad_());
      ZeRO<torch::optim::SGD> o(params, torch::optim::SGDOptions(LR));
      EXPECT_EQ(o.param_groups().size(), 1u);
      torch::Tensor added = torch::rand({3, 1});
      o.add_param_group(OptimizerParamGroup({added}));
      EXPECT_EQ(o.param_groups().size(), 2u);
      int64_t local = 0;
      for (const auto& g : o.optim().param_groups())
        for (const auto& p : g.params()) local += p.numel();
      EXPECT_EQ(local, 9 + 7 + 5 + 3) << "the new group went to the rank that was short";
      EXPECT_EQ(o.optim().param_groups().size(), 2u);
      EXPECT_EQ(o.param_owners().back(), n - 1);
      EXPECT_EQ(o.param_groups()[1].options().get_lr(), LR) << "a group without options takes the defaults";
    }
    {  // some trainable: a big first parameter that needs no gradient
      std::vector<torch::Tensor> params;
      for (int64_t s : {100, 3, 5, 2, 6, 4}) params.push_back(torch::rand({s, 1}));
      for (size_t i = 1; i < params.size(); ++i) params[i].requires_grad_(true);
      ZeRO<torch::optim::SGD> o(params, torch::optim::SGDOptions(LR));
      EXPECT_EQ(o.param_groups().size(), 1u);
      o.add_param_group(OptimizerParamGroup({torch::rand({3, 1})}, std::make_unique<torch::optim::SGDOptions>(0.5)));
      EXPECT_EQ(o.param_groups().size(), 2u);
      EXPECT_EQ(o.optim().param_groups().size(), 2u);
      EXPECT_EQ(o.optim().param_groups()[1].options().get_lr(), 0.5);
      // Rank 0 got the 100 and (n > 1) nothing else: the new parameter goes elsewhere.
      EXPECT_EQ(o.param_owners()[0], 0);
      if (n > 1) {
        EXPECT_NE(o.param_owners().back(), 0);
      }
    }
  });
}

// The seed's WD is 0.01, which is AdamWOptions' own default weight_decay. libtorch 2.15's
// Optimizer::add_param_group merges a group's options with the optimizer's defaults by comparing
// each field with the options type's default and inheriting the optimizer's where they are equal,
// so a group's explicit 0.01 becomes the optimizer's 0.0 (libtorch's own AdamW does the same; 2.6
// kept it). 0.05 keeps the seed's scenario (groups up front, added later, a local optimizer)
// independent of that merge.
TEST_P(ZeroRedundancyOptimizer, MultipleParamGroups) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int BATCH_SIZE = 8, NUM_ITERS = 3;
    const double WD = 0.05, LR = 0.01;
    auto model1 = make_mlp({5, 10, 5}, 11), model2 = make_mlp({5, 10, 5}, 11), model3 = make_mlp({5, 10, 5}, 11);
    torch::manual_seed(12);
    std::vector<torch::Tensor> inputs;
    for (int i = 0; i < NUM_ITERS; ++i) inputs.push_back(torch::randn({BATCH_SIZE, 5}));
    auto opts = [&](double wd) { return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(LR).weight_decay(wd)); };
    ZeRO<torch::optim::AdamW> optim1({OptimizerParamGroup(weights_of(model1), opts(0.0)), OptimizerParamGroup(biases_of(model1), opts(WD))},
                                     torch::optim::AdamWOptions(LR));
    ZeRO<torch::optim::AdamW> optim2(weights_of(model2), torch::optim::AdamWOptions(LR).weight_decay(0.0));
    optim2.add_param_group(OptimizerParamGroup(biases_of(model2), opts(WD)));
    torch::optim::AdamW optim3({OptimizerParamGroup(weights_of(model3), opts(0.0)), OptimizerParamGroup(biases_of(model3), opts(WD))},
                               torch::optim::AdamWOptions(LR));
    for (const auto& input : inputs) {
      optim1.zero_grad();
      model1->forward(input).sum().backward();
      optim1.step();
      optim2.zero_grad();
      model2->forward(input).sum().backward();
      optim2.step();
      set_grads_to_none(optim3);
      model3->forward(input).sum().backward();
      optim3.step();
      expect_same_params(model1->parameters(), model2->parameters(), "groups up front vs added later");
      expect_same_params(model1->parameters(), model3->parameters(), "ZeRO vs a local optimizer");
    }
    (void)ctx;
  });
}

TEST_P(ZeroRedundancyOptimizer, CollectShards) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const double LR = 1e-3, MOMENTUM = 0.99;
    const int BATCH_SIZE = 3, INPUT_DIM = 20, OUTPUT_DIM = 5, REFERENCE_RANK = 0;
    torch::manual_seed(ctx.rank);
    torch::Tensor target = torch::rand({BATCH_SIZE, OUTPUT_DIM});
    torch::Tensor inputs = torch::rand({BATCH_SIZE, INPUT_DIM});
    auto model = make_mlp({INPUT_DIM, 10, OUTPUT_DIM}, 0);
    torch::nn::L1Loss loss_fn;
    ZeRO<torch::optim::SGD> optimizer(model->parameters(), torch::optim::SGDOptions(LR).momentum(MOMENTUM));
    auto closure = [&] {
      optimizer.zero_grad();
      torch::Tensor loss = loss_fn(model->forward(inputs), target);
      loss.backward();
      return loss;
    };
    optimizer.step(closure);
    // This rank's momentum buffers before the round trip.
    std::map<fsdpp::compat::OptimizerStateKey, torch::Tensor> before;
    for (auto& [key, st] : optimizer.optim().state())
      before[key] = static_cast<torch::optim::SGDParamState&>(*st).momentum_buffer().clone();
    EXPECT_FALSE(before.empty() && !optimizer.partition()[ctx.rank].empty());

    optimizer.consolidate_state_dict(REFERENCE_RANK);
    std::string bytes;
    if (ctx.rank == REFERENCE_RANK) {
      fsdpp::OptimizerStateDict sd = optimizer.state_dict();
      EXPECT_EQ(sd.state.size(), model->parameters().size());
      bytes = sd.to_bytes();
    }
    fsdpp::broadcast_bytes(bytes, REFERENCE_RANK);
    optimizer.load_state_dict(optimizer.state_dict_from_bytes(bytes));
    ASSERT_EQ(optimizer.optim().state().size(), before.size());
    for (auto& [key, buf] : before)
      EXPECT_TRUE(torch::equal(static_cast<torch::optim::SGDParamState&>(*optimizer.optim().state().at(key)).momentum_buffer(), buf));
  });
}

// libtorch's SGD, Adam and AdamW have no `maximize` option (2.15 neither). PyTorch's maximize steps on the
// negated gradient; this user subclass does exactly that, so maximize=true runs a user-defined
// optimizer through ZeRO (state types found through its base class).
template <typename Base>
class Maximize : public Base {
 public:
  using Base::Base;
  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::Tensor loss;
    if (closure) {
      torch::AutoGradMode enable_grad(true);
      loss = closure();
    }
    negate_grads();
    Base::step(nullptr);
    negate_grads();
    return loss;
  }

 private:
  void negate_grads() {
    torch::NoGradGuard no_grad;
    for (auto& g : this->param_groups())
      for (auto& p : g.params())
        if (p.grad().defined()) p.mutable_grad().neg_();
  }
};

template <typename O>
void local_optimizer_parity(RankContext& ctx, const typename fsdpp::OptimizerTraits<O>::Options& options, const std::string& name,
                            bool maximize = false) {
  const bool bucket_view = maximize;  // the maximize runs also use parameters_as_bucket_view
  SCOPED_TRACE(name + (bucket_view ? " (parameters_as_bucket_view)" : ""));
  const int BATCHES = 20, BATCH_SIZE = 64, INPUT_DIM = 2, HIDDEN_DIM = 3, OUTPUT_DIM = 3;
  auto sharded_model = make_mlp({INPUT_DIM, HIDDEN_DIM, HIDDEN_DIM, OUTPUT_DIM}, 0);
  auto local_model = make_mlp({INPUT_DIM, HIDDEN_DIM, HIDDEN_DIM, OUTPUT_DIM}, 0);
  ZeRO<O> sharded_optimizer(sharded_model->parameters(), options, {}, bucket_view);
  O local_optimizer(local_model->parameters(), options);
  expect_same_params(sharded_model->parameters(), local_model->parameters(), "Models differ from the start");
  torch::manual_seed(100 + ctx.rank);  // each rank its own data; gradients averaged as DDP would

  auto check_step = [&] {
    torch::Tensor input = torch::rand({BATCH_SIZE, INPUT_DIM});
    auto closure_local = [&] {
      set_grads_to_none(local_optimizer);
      torch::Tensor loss = local_model->forward(input).abs().sum();
      loss.backward();
      average_grads(local_model->parameters(), ctx.world_size);
      return loss;
    };
    auto closure_sharded = [&] {
      sharded_optimizer.zero_grad();
      torch::Tensor loss = sharded_model->forward(input).abs().sum();
      loss.backward();
      average_grads(sharded_model->parameters(), ctx.world_size);
      return loss;
    };
    torch::Tensor loss_local = local_optimizer.step(closure_local);
    torch::Tensor loss_sharded = sharded_optimizer.step(closure_sharded);
    EXPECT_TRUE(same(loss_local, loss_sharded)) << "Losses differ between local optimizer and ZeRO";
    expect_same_params(sharded_model->parameters(), local_model->parameters(), "Models differ after a step");
  };

  torch::Tensor probe = torch::rand({BATCH_SIZE, INPUT_DIM});
  auto probe_loss = [&] {
    torch::NoGradGuard no_grad;
    return sharded_model->forward(probe).abs().sum().item<double>();
  };
  const double loss_before = probe_loss();
  for (int i = 0; i < BATCHES; ++i) {
    check_step();
    // Second half: toggle the first parameter's trainability.
    if (i > BATCHES / 2) {
      local_model->parameters()[0].requires_grad_(i % 2);
      sharded_model->parameters()[0].requires_grad_(i % 2);
    }
  }
  local_model->parameters()[0].requires_grad_(true);
  sharded_model->parameters()[0].requires_grad_(true);
  if (maximize)
    EXPECT_GT(probe_loss(), loss_before) << "maximize did not increase the loss";
  else
    EXPECT_LT(probe_loss(), loss_before) << "training did not decrease the loss";

  // The state dicts are interchangeable between the local optimizer and ZeRO.
  const int REFERENCE_RANK = 0;
  const std::string local_state = save_plain(local_optimizer);
  fsdpp::OptimizerStateDict sharded_state = consolidated_everywhere(sharded_optimizer, REFERENCE_RANK);
  // Cross-load the states, run one step, the models must still agree.
  load_plain(local_optimizer, sharded_state.to_bytes());
  sharded_optimizer.load_state_dict(sharded_optimizer.state_dict_from_bytes(local_state));
  check_step();
  // Reload their own states, again.
  load_plain(local_optimizer, local_state);
  sharded_optimizer.load_state_dict(sharded_state);
  check_step();
}

TEST_P(ZeroRedundancyOptimizer, LocalOptimizerParity) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const double LR = 1e-3;
    local_optimizer_parity<torch::optim::Adam>(ctx, torch::optim::AdamOptions(LR), "Adam");
    local_optimizer_parity<torch::optim::AdamW>(ctx, torch::optim::AdamWOptions(LR), "AdamW");
    local_optimizer_parity<torch::optim::SGD>(ctx, torch::optim::SGDOptions(LR), "SGD");
    local_optimizer_parity<Maximize<torch::optim::Adam>>(ctx, torch::optim::AdamOptions(LR), "Adam maximize", true);
    local_optimizer_parity<Maximize<torch::optim::AdamW>>(ctx, torch::optim::AdamWOptions(LR), "AdamW maximize", true);
    local_optimizer_parity<Maximize<torch::optim::SGD>>(ctx, torch::optim::SGDOptions(LR), "SGD maximize", true);
  });
}

// The other optimizers the issue names, with the same scenario.
TEST_P(ZeroRedundancyOptimizer, LocalOptimizerParityRMSpropAdagrad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    local_optimizer_parity<torch::optim::RMSprop>(ctx, torch::optim::RMSpropOptions(1e-3), "RMSprop");
    local_optimizer_parity<torch::optim::Adagrad>(ctx, torch::optim::AdagradOptions(1e-2), "Adagrad");
  });
}

// ------------------------------------------------------------------------------------------
// Join: uneven inputs (seed's test_zero_join_cpu). Rank r has 3 + r inputs per epoch. As in
// the seed, DDP with a local Adam under ddp.join() gives the ground truth, and ZeRO under Join,
// its joined ranks' gradients set by a GradientSetter, must match it. Both are checked against
// an independent reference: a plain Adam stepping on the gradients join promises. The loop
// never clears `.grad` (as the seed's), so at iteration t each rank still training reduces
// G(t-1) + g_r(t), and G(t) = (k(t) G(t-1) + sum of the k(t) training ranks' g_r(t)) / n.
// ------------------------------------------------------------------------------------------

class GradientSetter : public fsdpp::Joinable {
 public:
  GradientSetter(std::vector<torch::Tensor> params, const std::vector<std::vector<torch::Tensor>>& grads, int& iter)
      : params_(std::move(params)), grads_(grads), iter_(iter) {}
  void set_grads() {
    const auto& g = grads_.at(iter_);
    for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = g[i].clone();
  }
  void advance() { ++iter_; }
  std::unique_ptr<fsdpp::JoinHook> join_hook() override {
    struct Hook : fsdpp::JoinHook {
      GradientSetter& setter;
      explicit Hook(GradientSetter& s) : setter(s) {}
      void main_hook() override {
        setter.set_grads();  // the gradients for this iteration; ZeRO's hook then steps
        setter.advance();
        ++setter.joined_iterations;
      }
      void post_hook(bool is_last_joiner) override { setter.last_joiner = is_last_joiner; }
    };
    return std::make_unique<Hook>(*this);
  }
  fsdpp::ProcessGroup join_process_group() const override { return fsdpp::default_group(); }

  int joined_iterations = 0;
  int last_joiner = -1;

 private:
  std::vector<torch::Tensor> params_;
  const std::vector<std::vector<torch::Tensor>>& grads_;
  int& iter_;
};

struct ZeroJoinData {
  static constexpr int NUM_INPUTS = 3, NUM_EPOCHS = 2;
  static constexpr double LR = 0.01;
  int n;
  std::vector<std::vector<torch::Tensor>> inputs;  // per rank
  torch::Tensor labels;
  std::vector<std::vector<torch::Tensor>> grads_at, params_at;  // the reference, per iteration

  static int num_inputs(int r) { return NUM_INPUTS + r; }
  int iterations(int r) const { return NUM_EPOCHS * num_inputs(r); }
  const torch::Tensor& input(int r, int t) const { return inputs[r][t % num_inputs(r)]; }

  explicit ZeroJoinData(int world_size) : n(world_size), inputs(world_size) {
    for (int r = 0; r < n; ++r) {
      torch::manual_seed(1000 + r);
      for (int i = 0; i < num_inputs(r); ++i) inputs[r].push_back(torch::randn({20, 2}));
    }
    torch::manual_seed(999);
    labels = torch::randn({20, 3});
    auto ref_model = make_mlp({2, 3, 3, 3}, 0);
    torch::optim::Adam ref_optim(ref_model->parameters(), torch::optim::AdamOptions(LR));
    std::vector<torch::Tensor> previous;  // G(t-1)
    for (const auto& p : ref_model->parameters()) previous.push_back(torch::zeros_like(p));
    for (int t = 0; t < iterations(n - 1); ++t) {
      std::vector<torch::Tensor> sum;
      for (const auto& p : previous) sum.push_back(torch::zeros_like(p));
      for (int r = 0; r < n; ++r) {
        if (t >= iterations(r)) continue;  // rank r has joined
        set_grads_to_none(ref_optim);
        torch::mse_loss(ref_model->forward(input(r, t)), labels).backward();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += previous[i] + ref_model->parameters()[i].grad();
      }
      grads_at.emplace_back();
      for (size_t i = 0; i < sum.size(); ++i) {
        grads_at[t].push_back(sum[i] / n);
        ref_model->parameters()[i].mutable_grad() = grads_at[t][i].clone();
      }
      previous = grads_at[t];
      ref_optim.step();
      params_at.emplace_back();
      for (const auto& p : ref_model->parameters()) params_at[t].push_back(p.detach().clone());
    }
  }
};

std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad());
  return out;
}

fsdpp::testing::RunOptions zero_join_run_options() {
  fsdpp::testing::RunOptions options;
  options.deadline = std::chrono::seconds(90);
  options.collective_timeout = std::chrono::milliseconds(20000);
  return options;
}

TEST_P(ZeroRedundancyOptimizer, ZeroJoinCpu) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const ZeroJoinData data(ctx.world_size);
    const int n = ctx.world_size, total_iters = data.iterations(n - 1);

    // DDP with a local optimizer on uneven inputs (the seed's ground truth), against the reference.
    auto model = make_mlp({2, 3, 3, 3}, 0);
    fsdpp::DistributedDataParallel ddp_model(model);
    torch::optim::Adam local_optim(model->parameters(), torch::optim::AdamOptions(ZeroJoinData::LR));
    int t = 0;
    ddp_model.join([&] {
      for (; t < data.iterations(ctx.rank); ++t) {
        torch::mse_loss(ddp_model.forward(data.input(ctx.rank, t)), data.labels).backward();
        expect_same_params(grads_of(model->parameters()), data.grads_at[t], "DDP's gradients at iteration " + std::to_string(t));
        local_optim.step();
        expect_same_params(model->parameters(), data.params_at[t], "DDP's parameters at iteration " + std::to_string(t));
      }
    });
    expect_same_params(model->parameters(), data.params_at.back(), "DDP's parameters after all ranks joined");

    // ZeRO on uneven inputs with the gradients set by hand: a joined rank keeps setting them.
    auto zero_model = make_mlp({2, 3, 3, 3}, 0);
    ZeRO<torch::optim::Adam> zero_optim(zero_model->parameters(), torch::optim::AdamOptions(ZeroJoinData::LR));
    int iter = 0;
    GradientSetter setter(zero_model->parameters(), data.grads_at, iter);
    fsdpp::Join join({&setter, &zero_optim});
    join.run([&] {
      for (int i = 0; i < data.iterations(ctx.rank); ++i) {
        fsdpp::Join::notify_join_context(setter);  // this rank has not joined
        setter.set_grads();
        zero_optim.step();
        expect_same_params(zero_model->parameters(), data.params_at[iter],
                           "Parameters differ between using ZeRO and local optimizer at iteration " + std::to_string(iter));
        ++iter;
      }
    });
    EXPECT_EQ(setter.joined_iterations, total_iters - data.iterations(ctx.rank));
    EXPECT_EQ(iter, total_iters);
    EXPECT_EQ(setter.last_joiner, ctx.rank == n - 1 ? 1 : 0);
    expect_same_params(zero_model->parameters(), data.params_at.back(), "final parameters after all ranks joined");
  }, zero_join_run_options());
}

// DDP and ZeRO in one Join, DDP first: a joined rank's DDP hook shadows the reductions and
// writes their result to its `.grad`, so ZeRO's hook steps its partition with the averaged
// gradients: no GradientSetter needed, and the same result as DDP with a local optimizer.
TEST_P(ZeroRedundancyOptimizer, DdpAndZeroUnderOneJoin) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const ZeroJoinData data(ctx.world_size);
    auto model = make_mlp({2, 3, 3, 3}, 0);
    fsdpp::DistributedDataParallel ddp_model(model);
    ZeRO<torch::optim::Adam> zero_optim(model->parameters(), torch::optim::AdamOptions(ZeroJoinData::LR));
    fsdpp::Join({&ddp_model, &zero_optim}).run([&] {
      for (int t = 0; t < data.iterations(ctx.rank); ++t) {
        torch::mse_loss(ddp_model.forward(data.input(ctx.rank, t)), data.labels).backward();
        zero_optim.step();
        expect_same_params(model->parameters(), data.params_at[t], "parameters at iteration " + std::to_string(t));
      }
    });
    expect_same_params(grads_of(model->parameters()), data.grads_at.back(), "gradients after all ranks joined");
    expect_same_params(model->parameters(), data.params_at.back(), "parameters after all ranks joined");
  }, zero_join_run_options());
}

// ZeRO alone in a Join context: its own step notifies, and a joined rank's hook steps without
// notifying again (else the all_reduces would pair up wrongly and hang).
TEST_P(ZeroRedundancyOptimizer, ZeroJoinOptimizerOnly) {
  fsdpp::testing::RunOptions options;
  options.deadline = std::chrono::seconds(60);
  options.collective_timeout = std::chrono::milliseconds(15000);
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp({3, 4, 2}, 0);
    ZeRO<torch::optim::SGD> zero(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
    for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
    fsdpp::Join({&zero}).run([&] {
      for (int i = 0; i < 2 + ctx.rank; ++i) zero.step();
    });
    // Every rank took 2 + (n - 1) steps with gradient one: compare with a plain SGD.
    auto ref = make_mlp({3, 4, 2}, 0);
    torch::optim::SGD sgd(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::ones_like(p);
    for (int i = 0; i < 2 + ctx.world_size - 1; ++i) sgd.step();
    expect_same_params(model->parameters(), ref->parameters(), "after join");
  }, options);
}

// ------------------------------------------------------------------------------------------
// parameters_as_bucket_view, memory, bad input.
// ------------------------------------------------------------------------------------------

TEST_P(ZeroRedundancyOptimizer, ParametersAsBucketView) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    for (bool bucket_view : {false, true}) {
      SCOPED_TRACE(bucket_view ? "bucket view" : "per parameter");
      auto model = make_mlp({4, 5, 3, 2}, 2), ref = make_mlp({4, 5, 3, 2}, 2);
      std::vector<const void*> impls;
      for (auto& p : model->parameters()) impls.push_back(p.unsafeGetTensorImpl());
      ZeRO<torch::optim::SGD> zero(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9), {}, bucket_view);
      torch::optim::SGD plain(ref->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      expect_same_params(model->parameters(), ref->parameters(), "bucketing changed the values");
      for (size_t i = 0; i < impls.size(); ++i) EXPECT_EQ(model->parameters()[i].unsafeGetTensorImpl(), impls[i]);
      auto check_buckets = [&] {
        if (!bucket_view) {
          EXPECT_TRUE(zero.buckets().empty());
          return;
        }
        ASSERT_EQ(zero.buckets().size(), static_cast<size_t>(n));
        for (size_t i = 0; i < zero.params().size(); ++i) {
          const auto& p = zero.params()[i];
          const auto& bucket = zero.buckets()[zero.param_owners()[i]];
          auto* begin = static_cast<char*>(bucket.data_ptr());
          auto* data = static_cast<char*>(p.data_ptr());
          EXPECT_TRUE(data >= begin && data + p.nbytes() <= begin + bucket.nbytes())
              << "parameter " << i << " is not a view into its owner's bucket";
        }
      };
      check_buckets();
      torch::manual_seed(4);
      auto train = [&](int steps) {
        for (int s = 0; s < steps; ++s) {
          torch::Tensor input = torch::randn({6, 4});
          zero.zero_grad();
          model->forward(input).pow(2).mean().backward();
          int nonempty = 0;
          for (const auto& part : zero.partition()) nonempty += !part.empty();
          fsdpp::CommDebugMode comm;
          zero.step();
          if (n > 1)
            EXPECT_EQ(comm.count("broadcast"), bucket_view ? nonempty : static_cast<int64_t>(zero.params().size()));
          else
            EXPECT_EQ(comm.get_total_counts(), 0);
          set_grads_to_none(plain);
          ref->forward(input).pow(2).mean().backward();
          plain.step();
          expect_same_params(model->parameters(), ref->parameters(), "step " + std::to_string(s));
        }
      };
      train(3);
      // A new group: the buckets are rebuilt around it.
      torch::Tensor extra = torch::randn({7}).requires_grad_(), extra_ref = extra.detach().clone().requires_grad_();
      const torch::Tensor extra_init = extra.detach().clone();
      zero.add_param_group(OptimizerParamGroup({extra}));
      plain.add_param_group(OptimizerParamGroup({extra_ref}));
      check_buckets();
      for (int s = 0; s < 2; ++s) {
        extra.mutable_grad() = torch::full({7}, 0.5);
        extra_ref.mutable_grad() = torch::full({7}, 0.5);
        zero.step();
        plain.step();
      }
      EXPECT_TRUE(same(extra, extra_ref)) << extra << extra_ref;
      EXPECT_FALSE(same(extra, extra_init)) << "the added parameter did not move";
    }
  });
}

int64_t state_bytes(const torch::optim::Optimizer& o) {
  int64_t bytes = 0;
  for (const auto& [key, st] : o.state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*st);
    for (const auto& t : {s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()})
      if (t.defined()) bytes += t.nbytes();
  }
  return bytes;
}

// Not a benchmark: the local optimizer state of each rank is about 1/N of a plain optimizer's.
TEST_P(ZeroRedundancyOptimizer, OptimizerStateBytesScaleAsOneOverN) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    auto model = make_mlp({16, 16, 16, 16, 16, 16, 16, 16, 16}, 0), ref = make_mlp({16, 16, 16, 16, 16, 16, 16, 16, 16}, 0);
    ZeRO<torch::optim::Adam> zero(model->parameters(), torch::optim::AdamOptions(1e-3));
    torch::optim::Adam plain(ref->parameters(), torch::optim::AdamOptions(1e-3));
    for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::ones_like(p);
    zero.step();
    plain.step();
    const int64_t plain_bytes = state_bytes(plain), mine = state_bytes(zero.optim());
    EXPECT_EQ(plain_bytes, 2 * 4 * 8 * (16 * 16 + 16));  // exp_avg + exp_avg_sq, float
    torch::Tensor total = torch::tensor({mine});
    fsdpp::all_reduce(total);
    EXPECT_EQ(total.item<int64_t>(), plain_bytes) << "the shards must add up to the whole state";
    // Sorted-greedy keeps every rank within one parameter of the mean.
    const int64_t largest = 2 * 4 * 16 * 16;
    EXPECT_LE(std::abs(mine - plain_bytes / n), largest) << "rank " << ctx.rank << ": " << mine << " of " << plain_bytes;
    if (n > 1) {
      EXPECT_LE(mine, plain_bytes * 6 / (5 * n)) << "more than 1.2/N of the plain optimizer's state";
    }
  });
}

using AdamSnapshot = std::map<std::pair<fsdpp::compat::OptimizerStateKey, std::string>, torch::Tensor>;

AdamSnapshot snapshot_adam(const torch::optim::Optimizer& o) {
  AdamSnapshot out;
  for (const auto& [key, st] : o.state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*st);
    out[{key, "exp_avg"}] = s.exp_avg().clone();
    out[{key, "exp_avg_sq"}] = s.exp_avg_sq().clone();
    out[{key, "step"}] = torch::tensor({s.step()});
  }
  return out;
}

bool same_snapshot(const AdamSnapshot& a, const AdamSnapshot& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, v] : a)
    if (!b.count(k) || !torch::equal(v, b.at(k))) return false;
  return true;
}

// An optimizer state dict from another model: clear errors naming the mismatch, nothing changed.
TEST_P(ZeroRedundancyOptimizer, LoadStateDictFromAnotherModel) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp({3, 4, 2}, 0);  // weights [4, 3], [2, 4]
    ZeRO<torch::optim::Adam> zero(model->parameters(), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < 2; ++i) {
      for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p) * (i + 1);
      zero.step();
    }
    const auto before = snapshot_adam(zero.optim());
    EXPECT_EQ(before.empty(), zero.partition()[ctx.rank].empty());
    auto unchanged = [&](const std::string& what) {
      EXPECT_TRUE(same_snapshot(before, snapshot_adam(zero.optim()))) << what << ": the state changed";
      EXPECT_EQ(zero.param_groups()[0].options().get_lr(), 0.01) << what << ": the options changed";
      EXPECT_EQ(zero.optim().param_groups()[0].options().get_lr(), 0.01) << what << ": the local options changed";
    };
    auto plain_state = [](torch::nn::Sequential m) {
      torch::optim::Adam plain(m->parameters(), torch::optim::AdamOptions(0.5));
      for (auto& p : m->parameters()) p.mutable_grad() = torch::ones_like(p);
      plain.step();
      return fsdpp::OptimizerStateDict::from_optimizer(plain);
    };

    // Wrong number of parameters.
    std::string e = error_of([&] { zero.load_state_dict(plain_state(make_mlp({3, 4}, 0))); });
    EXPECT_NE(e.find("parameter group 0 has 2 parameters in the state dict, 4 in this optimizer"), std::string::npos) << e;
    unchanged("wrong count");
    // Wrong number of groups.
    {
      auto other = make_mlp({3, 4, 2}, 0);
      torch::optim::Adam plain({OptimizerParamGroup(weights_of(other)), OptimizerParamGroup(biases_of(other))},
                               torch::optim::AdamOptions(0.5));
      e = error_of([&] { zero.load_state_dict(fsdpp::OptimizerStateDict::from_optimizer(plain)); });
      EXPECT_NE(e.find("the state dict has 2 parameter groups, this optimizer has 1"), std::string::npos) << e;
      unchanged("wrong group count");
    }
    // Wrong shapes: Linear(4, 3) + Linear(3, 2) has four parameters of other shapes.
    e = error_of([&] { zero.load_state_dict(plain_state(make_mlp({4, 3, 2}, 0))); });
    EXPECT_NE(e.find("the state 'exp_avg' of parameter 0 (group 0, shape [4, 3]) has shape [3, 4], not the parameter's"),
              std::string::npos)
        << e;
    unchanged("wrong shapes");
    // Only the last entry is bad (and the options differ): nothing of the rest is applied.
    {
      fsdpp::OptimizerStateDict sd = plain_state(make_mlp({3, 4, 2}, 0));
      sd.state.at("3").set("exp_avg", torch::zeros({5}));
      e = error_of([&] { zero.load_state_dict(sd); });
      EXPECT_NE(e.find("the state 'exp_avg' of parameter 3 (group 0, shape [2]) has shape [5]"), std::string::npos) << e;
      unchanged("one bad entry");
      sd.state["7"] = sd.state.at("0");
      sd.state.at("3").set("exp_avg", torch::zeros({2}));
      e = error_of([&] { zero.load_state_dict(sd); });
      EXPECT_NE(e.find("state for parameter 7, which none of its parameter groups lists"), std::string::npos) << e;
      unchanged("unknown parameter");
    }
    // Another optimizer's state dict.
    {
      auto other = make_mlp({3, 4, 2}, 0);
      torch::optim::SGD sgd(other->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      for (auto& p : other->parameters()) p.mutable_grad() = torch::ones_like(p);
      sgd.step();
      e = error_of([&] { zero.load_state_dict(fsdpp::OptimizerStateDict::from_optimizer(sgd)); });
      EXPECT_NE(e.find("parameter group 0 has options of type torch::optim::SGDOptions, this optimizer uses torch::optim::AdamOptions"),
                std::string::npos)
          << e;
      e = error_of([&] { zero.state_dict_from_bytes(save_plain(sgd)); });
      EXPECT_NE(e.find("reading an optimizer state dict: cannot read"), std::string::npos) << e;
      e = error_of([&] { zero.state_dict_from_bytes("not an archive"); });
      EXPECT_NE(e.find("14 bytes are not a libtorch archive"), std::string::npos) << e;
      unchanged("another optimizer");
    }
    // Still usable, and still in step with the others.
    for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
    zero.step();
    auto ref = make_mlp({3, 4, 2}, 0);
    torch::optim::Adam plain(ref->parameters(), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < 3; ++i) {
      for (auto& p : ref->parameters()) p.mutable_grad() = torch::ones_like(p) * (i < 2 ? i + 1 : 1);
      plain.step();
    }
    expect_same_params(model->parameters(), ref->parameters(), "after the failed loads");
  });
}

// A closure that throws: the error propagates, no parameter and no state changed, and the
// optimizer goes on working.
TEST_P(ZeroRedundancyOptimizer, ClosureThatThrows) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    auto model = make_mlp({3, 4, 2}, 0), ref = make_mlp({3, 4, 2}, 0);
    ZeRO<torch::optim::Adam> zero(model->parameters(), torch::optim::AdamOptions(0.1));
    torch::optim::Adam plain(ref->parameters(), torch::optim::AdamOptions(0.1));
    torch::Tensor input = torch::ones({2, 3});
    std::vector<torch::Tensor> before;
    for (auto& p : model->parameters()) before.push_back(p.detach().clone());
    auto throwing = [&]() -> torch::Tensor {
      zero.zero_grad();
      model->forward(input).sum().backward();
      throw std::runtime_error("closure failed on purpose");
    };
    try {
      zero.step(throwing);
      ADD_FAILURE() << "step() swallowed the closure's exception";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("closure failed on purpose"), std::string::npos) << e.what();
    }
    for (size_t i = 0; i < before.size(); ++i)
      EXPECT_TRUE(torch::equal(model->parameters()[i], before[i])) << "parameter " << i << " changed";
    EXPECT_TRUE(zero.optim().state().empty()) << "the failed step created optimizer state";
    // A good step now matches a plain optimizer's first step.
    auto closure = [&] {
      zero.zero_grad();
      torch::Tensor loss = model->forward(input).sum();
      loss.backward();
      return loss;
    };
    zero.step(closure);
    ref->forward(input).sum().backward();
    plain.step();
    expect_same_params(model->parameters(), ref->parameters(), "after the failed step");
    (void)ctx;
  });
}

// A custom optimizer with only OptimizerTraits: its state's own fields are the entries, numbers
// round-trip as numbers (int64 and double), a plain optimizer reads ZeRO's archive, and a resumed
// ZeRO steps exactly like the uninterrupted one.
TEST_P(ZeroRedundancyOptimizer, CustomOptimizerStateDictRoundTrip) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    using custom_optim::Counting;
    using custom_optim::CountingOptions;
    using custom_optim::CountingParamState;
    auto model = make_mlp({3, 4, 2}, 0);
    ZeRO<Counting> zero(model->parameters(), CountingOptions(0.1));
    auto grads_and_step = [](torch::nn::Sequential& m, torch::optim::Optimizer& o) {
      for (auto& p : m->parameters()) p.mutable_grad() = torch::ones_like(p);
      o.step();
    };
    for (int i = 0; i < 2; ++i) grads_and_step(model, zero);

    fsdpp::OptimizerStateDict sd = consolidated_everywhere(zero, 0);
    ASSERT_EQ(sd.state.size(), 4u);
    for (int64_t i = 0; i < 4; ++i) {
      const fsdpp::StateDict& st = state_of(sd, i);
      EXPECT_EQ(st.keys().size(), 3u) << "parameter " << i;
      EXPECT_EQ(st.at("steps").tensor().item<int64_t>(), 2);
      EXPECT_EQ(st.at("scale").tensor().item<double>(), 0.25);
      EXPECT_TRUE(torch::equal(st.at("total").tensor(), torch::full_like(model->parameters()[i], 2.0)));
    }

    // ZeRO's archive -> a plain optimizer of the custom type, through libtorch's own loader.
    auto plain_model = make_mlp({3, 4, 2}, 0);
    Counting plain(plain_model->parameters(), CountingOptions(0.1));
    load_plain(plain, sd.to_bytes());
    for (const auto& p : plain_model->parameters()) {
      const auto& st = static_cast<const CountingParamState&>(*plain.state().at(key_of(p)));
      EXPECT_EQ(st.steps(), 2);
      EXPECT_EQ(st.scale(), 0.25);
    }

    // A fresh ZeRO resumes and steps like the uninterrupted one.
    auto resumed_model = make_mlp({3, 4, 2}, 0);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < model->parameters().size(); ++i) resumed_model->parameters()[i].copy_(model->parameters()[i]);
    }
    ZeRO<Counting> resumed(resumed_model->parameters(), CountingOptions(0.5));
    resumed.load_state_dict(sd);
    EXPECT_EQ(resumed.param_groups()[0].options().get_lr(), 0.1);
    grads_and_step(model, zero);
    grads_and_step(resumed_model, resumed);
    expect_same_params(resumed_model->parameters(), model->parameters(), "after resuming");
    (void)ctx;
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(ZeroRedundancyOptimizer);

}  // namespace
}  // namespace zero_test

#pragma once
// What the FSDP tests share: the reference models, the shard arithmetic they check against,
// the train-parity loop against single-process training on the global batch, and resuming a
// model and its optimizer from a distributed checkpoint.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/tensor_parallel.h>

#include "dist/world_sizes.h"
#include "fsdp/testing_delays.h"
#include "harness/multi_process.h"

namespace fsdpp {

using testing::RankContext;
using testing::run_ranks;
using torch::nn::Linear;
using torch::nn::ReLU;
using torch::nn::Sequential;
using FSDPLinear = FullyShardedDataParallel<torch::nn::LinearImpl>;
using FSDPSequential = FullyShardedDataParallel<torch::nn::SequentialImpl>;

inline constexpr double kRtol = 1.3e-6;
inline constexpr double kAtol = 1e-5;
inline constexpr int64_t kGlobalBatch = 12;  // divisible by every world size tested

using Shapes = std::vector<std::pair<int64_t, int64_t>>;

// Rows [rank * ceil(d0 / n), ...) of a full tensor: what rank `rank` holds of it.
inline at::Tensor shard_rows(const at::Tensor& full, int rank, int n) {
  const int64_t d0 = full.size(0), chunk = (d0 + n - 1) / n;
  const int64_t start = std::min<int64_t>(d0, rank * chunk);
  const int64_t len = std::max<int64_t>(0, std::min<int64_t>(chunk, d0 - rank * chunk));
  return full.narrow(0, start, len);
}

inline std::vector<FSDPModule*> fsdp_units(torch::nn::Module& model) {
  std::vector<FSDPModule*> units;
  for (const auto& m : model.modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get())) units.push_back(f);
  return units;
}

// Copies of the full parameters, in their own dtype (summon_full_params, without writeback).
inline std::vector<at::Tensor> full_params(torch::nn::Module& model) {
  auto full = summon_full_params(model, /*writeback=*/false);
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

inline std::string strip_wrapper_prefixes(std::string name) {
  const std::string prefix = "_fsdp_wrapped_module.";
  for (size_t pos; (pos = name.find(prefix)) != std::string::npos;) name.erase(pos, prefix.size());
  return name;
}

inline Sequential make_mlp(const Shapes& shapes) {
  return Sequential(Linear(shapes[0].first, shapes[0].second), ReLU(), Linear(shapes[1].first, shapes[1].second));
}

// Linear(7, 15) and Linear(15, 15) as inner units, Linear(15, 3) left to the root.
inline Sequential make_multi_group(bool wrap, const FullyShardOptions& options) {
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  if (!wrap) return Sequential(l1, ReLU(), l2, ReLU(), l3);
  return Sequential(FSDPLinear(l1, options), ReLU(), FSDPLinear(l2, options), ReLU(), l3);
}

// The seeds' MLP: in_proj, relu, out_proj (then relu with `relu_out`, as PyTorch's
// common_fsdp.MLP). Its Linears are declared as TensorParallel wrappers, which are plain Linears
// until parallelize_module (2-D FSDP x TP) cuts them: the same module and FQNs either way.
using TPLinear = TensorParallel<torch::nn::LinearImpl>;
struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t dim, int64_t hidden, bool relu_out = false) : relu_out(relu_out) {
    in_proj = register_module("in_proj", TPLinear(Linear(dim, hidden)));
    out_proj = register_module("out_proj", TPLinear(Linear(hidden, dim)));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor z = out_proj->forward(torch::relu(in_proj->forward(x)));
    return relu_out ? torch::relu(z) : z;
  }
  TPLinear in_proj{nullptr}, out_proj{nullptr};
  bool relu_out;
};
TORCH_MODULE(MLP);

enum class Optim { kSGD, kAdam };
inline const char* name_of(Optim o) { return o == Optim::kSGD ? "SGD" : "Adam"; }

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optim o, const std::vector<at::Tensor>& params) {
  if (o == Optim::kSGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-2));
}

inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, kRtol, kAtol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

struct ParityCase {
  Optim optim = Optim::kAdam;
  int steps = 10;
  at::ScalarType dtype = at::kFloat;
  // Seed 001's four delay_* options: rank-dependent sleeps after forward, before every
  // all-gather and reduce-scatter, and before the optimizer step.
  bool delay_after_forward = false;
  bool delay_before_all_gather = false;
  bool delay_before_reduce_scatter = false;
  bool delay_before_optim = false;
  // Before each step's zero_grad (after the previous optimizer step), a forward of both models
  // under NoGradGuard, as an evaluation between training steps.
  bool eval_forward_between_steps = false;

  // The four delay flags from bits 0-3 of `mask` (0-15: the seed's 16 combinations).
  ParityCase& delays(int mask) {
    delay_after_forward = mask & 1;
    delay_before_all_gather = mask & 2;
    delay_before_reduce_scatter = mask & 4;
    delay_before_optim = mask & 8;
    return *this;
  }
  // Seed 001's sweep of test_train_parity_multi_group: mask -1 is SGD without delays, 0-15 Adam
  // with the delay flags of delays(mask). Delays reorder the ranks' collectives within every
  // step: 4 steps (both ways of zeroing the gradients, twice) keep the 16 combinations affordable
  // on 2 cores.
  static ParityCase for_delay_mask(int mask) {
    ParityCase c;
    if (mask < 0) {
      c.optim = Optim::kSGD;
      return c;
    }
    c.delays(mask);
    if (mask > 0) c.steps = 4;
    return c;
  }
  std::string delays_name() const {
    return std::string("delays af") + (delay_after_forward ? "1" : "0") + " ag" + (delay_before_all_gather ? "1" : "0") +
           " rs" + (delay_before_reduce_scatter ? "1" : "0") + " opt" + (delay_before_optim ? "1" : "0");
  }
};

// Trains `ref` on the global batch and `fsdp` (built from the same initial values) on this
// rank's slice; checks losses, gradient shards and full parameters after every step.
template <typename RefForward, typename Forward>
void check_train_parity(RankContext& ctx, torch::nn::Module& ref, RefForward&& ref_forward, torch::nn::Module& fsdp,
                        Forward&& fsdp_forward, int64_t in_dim, int64_t out_dim, const ParityCase& c,
                        const std::string& label) {
  const int n = ctx.world_size, rank = ctx.rank;
  auto ref_params = ref.parameters();
  auto fsdp_params = fsdp.parameters();
  ASSERT_EQ(ref_params.size(), fsdp_params.size());
  {
    auto ref_named = ref.named_parameters();
    auto named = fsdp.named_parameters();
    for (size_t i = 0; i < ref_named.size(); ++i)
      EXPECT_EQ(strip_wrapper_prefixes(named[i].key()), ref_named[i].key());
  }
  auto ref_opt = make_optimizer(c.optim, ref_params);
  auto opt = make_optimizer(c.optim, fsdp_params);  // built after sharding: holds the shards
  struct DelayGuard {
    DelayGuard(bool all_gather, bool reduce_scatter, int rank, int n) {
      if (all_gather) detail::testing_delays().before_all_gather_ms = 2 * rank;
      if (reduce_scatter) detail::testing_delays().before_reduce_scatter_ms = 2 * (n - 1 - rank);
    }
    ~DelayGuard() { detail::testing_delays() = {}; }
  } delays(c.delay_before_all_gather, c.delay_before_reduce_scatter, rank, n);
  const int64_t local = kGlobalBatch / n;
  for (int step = 0; step < c.steps; ++step) {
    const std::string where = label + " " + name_of(c.optim) + " step " + std::to_string(step);
    if (c.eval_forward_between_steps) {
      torch::NoGradGuard no_grad;
      torch::manual_seed(2000 + step);
      at::Tensor x = torch::randn({kGlobalBatch, in_dim}, c.dtype);
      expect_close(fsdp_forward(x.narrow(0, rank * local, local)), ref_forward(x).narrow(0, rank * local, local),
                   where + " evaluation forward");
    }
    // Even steps drop the gradients (set_to_none), odd steps zero them in place.
    for (auto* o : {ref_opt.get(), opt.get()}) {
      if (step % 2 == 0) {
        for (auto& group : o->param_groups())
          for (auto& p : group.params()) p.mutable_grad().reset();
      } else {
        o->zero_grad();
      }
    }
    torch::manual_seed(1000 + step);
    at::Tensor x = torch::randn({kGlobalBatch, in_dim}, c.dtype);
    at::Tensor y = torch::randn({kGlobalBatch, out_dim}, c.dtype);
    at::Tensor ref_loss = (ref_forward(x) - y).pow(2).mean();
    ref_loss.backward();

    at::Tensor loss = (fsdp_forward(x.narrow(0, rank * local, local)) - y.narrow(0, rank * local, local)).pow(2).mean();
    if (c.delay_after_forward) std::this_thread::sleep_for(std::chrono::milliseconds(5 * rank));
    loss.backward();
    for (size_t i = 0; i < fsdp_params.size(); ++i) {
      const at::Tensor& p = fsdp_params[i];
      ASSERT_EQ(p.sizes(), shard_rows(ref_params[i], rank, n).sizes()) << where << " param " << i << " is not a shard";
      ASSERT_EQ(p.scalar_type(), c.dtype) << where << " param " << i;
      ASSERT_EQ(p.grad().scalar_type(), c.dtype) << where << " grad " << i;
      expect_close(p.grad(), shard_rows(ref_params[i].grad(), rank, n), where + " grad " + std::to_string(i));
    }
    if (c.delay_before_optim) std::this_thread::sleep_for(std::chrono::milliseconds(5 * (n - 1 - rank)));
    ref_opt->step();
    opt->step();

    at::Tensor global_loss = loss.detach().clone();
    all_reduce(global_loss, ReduceOp::AVG);
    expect_close(global_loss, ref_loss.detach(), where + " loss");
    auto full = full_params(fsdp);
    for (size_t i = 0; i < full.size(); ++i) expect_close(full[i], ref_params[i].detach(), where + " param " + std::to_string(i));
    if (::testing::Test::HasFailure()) return;
  }
}

// Seed 001's test_train_parity_multi_group: make_multi_group wrapped with `options` trains at
// parity with the plain model (check_train_parity); returns the trained model.
inline FSDPSequential check_multi_group_parity(RankContext& ctx, const FullyShardOptions& options, const ParityCase& c,
                                               const std::string& label) {
  torch::manual_seed(42);
  Sequential ref = make_multi_group(false, options);
  torch::manual_seed(42);
  FSDPSequential model(make_multi_group(true, options), options);
  check_train_parity(ctx, *ref, [&](const at::Tensor& x) { return ref->forward(x); }, *model,
                     [&](const at::Tensor& x) { return model->forward(x); }, 7, 3, c, label);
  return model;
}

// Seed 001's reshard_after_forward sweep: True, False, and 2 where 2 divides the group size
// (PyTorch refuses it otherwise; FullyShardReshardAfterForwardInt tests that refusal).
inline std::vector<std::pair<FullyShardOptions, std::string>> reshard_after_forward_sweep(int world_size) {
  std::vector<std::pair<FullyShardOptions, std::string>> out{
      {FullyShardOptions().reshard_after_forward(true), "raf T"}, {FullyShardOptions().reshard_after_forward(false), "raf F"}};
  if (world_size % 2 == 0) out.emplace_back(FullyShardOptions().reshard_after_forward(2), "raf 2");
  return out;
}

// Loads the SHARDED state dicts of `model` and `opt` (which may have no state yet) from the
// checkpoint in `dir`, saved under "model." and "optim.", and sets them back; the plain entries of
// `extra` (e.g. {{"step", 0}}) are loaded with them. Returns every entry loaded.
inline checkpoint::State load_checkpoint(torch::nn::Module& model, torch::optim::Optimizer& opt, const std::string& dir,
                                         checkpoint::State extra = {}, const checkpoint::LoadOptions& options = {}) {
  StateDict model_sd = get_model_state_dict(model);
  OptimizerStateDict osd = checkpoint::optim_state_dict_to_load(checkpoint::read_metadata(dir), model_sd, "optim.");
  checkpoint::State state = checkpoint::to_state(model_sd, "model.");
  state.merge(checkpoint::to_state(osd, "optim."));
  state.merge(extra);
  checkpoint::load(state, dir, options);
  set_model_state_dict(model, model_sd);
  set_optimizer_state_dict(model, opt, osd);
  return state;
}

// Shared by test_fully_shard.cpp (which instantiates it) and test_fully_shard_composable.cpp.
class FullyShardGradientAccumulation : public testing::WorldSizeTest {};

}  // namespace fsdpp

// Model state dicts of FSDP models at world sizes 1-4, ported from seed 000 (PyTorch's
// test_fsdp_state_dict.py, FSDP1) and seed 002 (test_fully_shard_model_checkpoint.py). The
// reference is the plain (unwrapped) model built from the same seed and trained single-process
// on the whole global batch; each FSDP rank trains on its slice with a mean loss.
//
// Tolerance: values that are only copied (state dicts, loads) must be equal bitwise; trained
// values are compared with rtol 1.3e-6, atol 1e-5 (torch.testing's float32 defaults): FSDP sums
// the gradient in another order than the single process.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <functional>
#include <map>
#include <optional>
#include <unordered_set>

#include <torch/torch.h>

#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/sharded_tensor.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "compat/optimizer_state_key.h"
#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using testing::error_of;
using testing::RankContext;
using testing::run_ranks;
using torch::nn::Linear;
using torch::nn::ReLU;
using torch::nn::Sequential;
using FSDPLinear = FullyShardedDataParallel<torch::nn::LinearImpl>;
using FSDPSequential = FullyShardedDataParallel<torch::nn::SequentialImpl>;

constexpr double kRtol = 1.3e-6;
constexpr double kAtol = 1e-5;
constexpr int64_t kGlobalBatch = 12;  // divisible by every world size tested

// A module with a (persistent) buffer: x * scale.
struct ScaleImpl : torch::nn::Module {
  explicit ScaleImpl(int64_t n) { scale = register_buffer("scale", torch::arange(n).to(at::kFloat) * 0.1 + 1); }
  at::Tensor forward(at::Tensor x) { return x * scale; }
  at::Tensor scale;
};
TORCH_MODULE(Scale);

enum class Wrap { kNone, kNested, kRootOnly, kSubmodules };
const char* name_of(Wrap w) {
  switch (w) {
    case Wrap::kNone: return "plain";
    case Wrap::kNested: return "nested";
    case Wrap::kRootOnly: return "root only";
    default: return "submodules";
  }
}

// Linear(7, 15), ReLU, Scale(15), Linear(15, 15), ReLU, Linear(15, 3): keys 0.*, 2.scale, 3.*, 5.*.
// kNested: the two first Linears are inner units and the root shards the last one; kRootOnly:
// one unit; kSubmodules: a plain root holding two units and a plain Linear.
struct Net {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(at::Tensor)> forward;
};

Net make_net(Wrap wrap, const FullyShardOptions& o = {}) {
  torch::manual_seed(0);
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  Scale scale(15);
  if (wrap == Wrap::kNone || wrap == Wrap::kRootOnly) {
    Sequential s(l1, ReLU(), scale, l2, ReLU(), l3);
    if (wrap == Wrap::kNone) return {s.ptr(), [s](at::Tensor x) mutable { return s->forward(x); }};
    FSDPSequential root(s, o);
    return {root.ptr(), [root](at::Tensor x) mutable { return root->forward(x); }};
  }
  Sequential s(FSDPLinear(l1, o), ReLU(), scale, FSDPLinear(l2, o), ReLU(), l3);
  if (wrap == Wrap::kSubmodules) return {s.ptr(), [s](at::Tensor x) mutable { return s->forward(x); }};
  FSDPSequential root(s, o);
  return {root.ptr(), [root](at::Tensor x) mutable { return root->forward(x); }};
}

const std::vector<std::string> kNetKeys{"0.weight", "0.bias", "2.scale", "3.weight", "3.bias", "5.weight", "5.bias"};
const std::vector<std::string> kNetParamKeys{"0.weight", "0.bias", "3.weight", "3.bias", "5.weight", "5.bias"};

std::vector<FSDPModule*> fsdp_units(torch::nn::Module& model) {
  std::vector<FSDPModule*> units;
  for (const auto& m : model.modules())
    if (auto* f = dynamic_cast<FSDPModule*>(m.get())) units.push_back(f);
  return units;
}

// The model's full parameters (gathered by the engine, not by the state dict) and buffers.
std::vector<at::Tensor> full_values(torch::nn::Module& model) {
  auto units = fsdp_units(model);
  for (auto* u : units) u->unshard();
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : model.buffers()) out.push_back(b.detach().clone());
  for (auto* u : units) u->reshard();
  return out;
}

void zero_model(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) p.zero_();
  for (auto& b : model.buffers()) b.zero_();
}

// Steps [first, first + steps) of training on the global batch (this rank's slice of it).
// Parameters no unit shards (a plain root's) have their gradients averaged over the world, as
// DDP would.
void train_with(Net& net, torch::optim::Optimizer& opt, int first, int steps, int rank, int n) {
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (auto* u : fsdp_units(*net.module))
    for (const auto& p : u->parameters()) sharded.insert(p.unsafeGetTensorImpl());
  const int64_t local = kGlobalBatch / n;
  for (int step = first; step < first + steps; ++step) {
    opt.zero_grad();
    torch::manual_seed(1000 + step);
    at::Tensor x = torch::randn({kGlobalBatch, 7}), y = torch::randn({kGlobalBatch, 3});
    at::Tensor loss = (net.forward(x.narrow(0, rank * local, local)) - y.narrow(0, rank * local, local)).pow(2).mean();
    loss.backward();
    if (n > 1)
      for (auto& p : net.module->parameters())
        if (!sharded.count(p.unsafeGetTensorImpl()) && p.grad().defined()) all_reduce(p.mutable_grad(), ReduceOp::AVG);
    opt.step();
  }
}

void train(Net& net, int steps, int rank, int n) {
  torch::optim::SGD opt(net.module->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  train_with(net, opt, 0, steps, rank, n);
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << ": undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, kRtol, kAtol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

void expect_equal_values(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << what << " #" << i;
    EXPECT_TRUE(at::equal(a[i], b[i])) << what << " #" << i;
  }
}

// A FULL state dict against the plain model's parameters and buffers, key by key, in order.
void expect_full_sd_equals_plain(const StateDict& sd, torch::nn::Module& plain, const std::string& what,
                                 bool exact = false) {
  std::vector<std::pair<std::string, at::Tensor>> expected;
  ASSERT_EQ(sd.keys(), kNetKeys) << what;
  auto params = plain.named_parameters();
  auto buffers = plain.named_buffers();
  for (const auto& key : kNetKeys) {
    const at::Tensor* t = params.find(key);
    if (!t) t = buffers.find(key);
    ASSERT_TRUE(t) << key;
    const StateDictValue& v = sd.at(key);
    ASSERT_TRUE(v.is_tensor()) << what << " " << key;
    if (exact)
      EXPECT_TRUE(at::equal(v.tensor(), *t)) << what << " " << key;
    else
      expect_close(v.tensor(), t->detach(), what + " " + key);
  }
}

const std::vector<StateDictType> kAllTypes{StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT,
                                           StateDictType::LOCAL_STATE_DICT};

class FSDPStateDict : public testing::WorldSizeTest {};

// Seed 000 test_state_dict_save_load_flow: train, take the state dict, zero the model, load, and
// the model equals the trained one; its FULL state dict equals the reference trained
// single-process (the seed's DDP run). Seed 002's test of the same name is
// FullyShardIgnored.test_state_dict_save_load_flow.
TEST_P(FSDPStateDict, StateDictSaveLoadFlow) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net ref = make_net(Wrap::kNone);
    train(ref, 3, 0, 1);
    for (Wrap wrap : {Wrap::kNested, Wrap::kRootOnly, Wrap::kSubmodules})
      for (StateDictType type : kAllTypes) {
        const std::string what = std::string(name_of(wrap)) + " " + to_string(type);
        Net net = make_net(wrap);
        train(net, 3, ctx.rank, ctx.world_size);
        auto trained = full_values(*net.module);
        StateDict sd;
        {
          auto scope = state_dict_type(*net.module, type);
          sd = state_dict(*net.module);
          EXPECT_EQ(sd.type, type);
          zero_model(*net.module);
          auto result = load_state_dict(*net.module, sd);
          EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty());
        }
        expect_equal_values(full_values(*net.module), trained, what + " reloaded");
        auto full = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true));
        expect_full_sd_equals_plain(full, *ref.module, what + " vs reference");
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Seed 000 test_fsdp_state_dict_keys: keys are the plain model's, no wrapper prefix.
TEST_P(FSDPStateDict, FsdpStateDictKeys) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT}) {
      set_state_dict_type(*net.module, type);
      StateDict sd = state_dict(*net.module);
      EXPECT_EQ(sd.keys(), kNetKeys) << to_string(type);
      if (type == StateDictType::SHARDED_STATE_DICT) {
        // Parameters sharded by FSDP are ShardedTensors holding this rank's rows; the buffer is whole.
        const ShardedTensor& w = sd.at("3.weight").sharded_tensor();
        EXPECT_EQ(w.size(), (std::vector<int64_t>{15, 15}));
        const int64_t chunk = (15 + ctx.world_size - 1) / ctx.world_size;
        const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(chunk, 15 - ctx.rank * chunk));
        if (rows > 0) {
          ASSERT_EQ(w.local_shards().size(), 1u);
          EXPECT_EQ(w.local_shards()[0].metadata.shard_offsets, (std::vector<int64_t>{ctx.rank * chunk, 0}));
          EXPECT_EQ(w.local_shards()[0].tensor.sizes(), (std::vector<int64_t>{rows, 15}));
        } else {
          EXPECT_TRUE(w.local_shards().empty());
        }
        EXPECT_TRUE(sd.at("2.scale").is_tensor());
      }
    }
    set_state_dict_type(*net.module, StateDictType::LOCAL_STATE_DICT);
    EXPECT_EQ(state_dict(*net.module).keys(),
              (std::vector<std::string>{"_flat_param", "0._flat_param", "2.scale", "3._flat_param"}));
    Net sub = make_net(Wrap::kSubmodules);
    set_state_dict_type(*sub.module, StateDictType::LOCAL_STATE_DICT);
    EXPECT_EQ(state_dict(*sub.module).keys(),
              (std::vector<std::string>{"0._flat_param", "2.scale", "3._flat_param", "5.weight", "5.bias"}));
  });
}

// Seed 000 test_state_dict_load_into_local_module: an FSDP model trained 3 steps, with an FSDP
// root (nested units) or a plain root holding units (the seed's fsdp_root False), gives a FULL
// (also rank0_only + offload) or SHARDED state dict; gathered into whole tensors (the seed's
// _gather_state_dict) it loads strictly into the zeroed plain model, which then holds the
// trained values. The other way, the plain model's state dict loads into the FSDP model.
TEST_P(FSDPStateDict, StateDictLoadIntoLocalModule) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (Wrap wrap : {Wrap::kNested, Wrap::kSubmodules})
      for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT})
        for (bool rank0_only_and_offload : {false, true}) {
          if (rank0_only_and_offload && type != StateDictType::FULL_STATE_DICT) continue;
          const std::string what = std::string(name_of(wrap)) + " " + to_string(type) +
                                   (rank0_only_and_offload ? " rank0_only+offload" : "");
          Net net = make_net(wrap);
          train(net, 3, ctx.rank, ctx.world_size);
          const auto trained = full_values(*net.module);
          std::optional<StateDictConfig> config;
          if (rank0_only_and_offload) config = FullStateDictConfig().rank0_only(true).offload_to_cpu(true);
          StateDict sd;
          {
            auto scope = state_dict_type(*net.module, type, config);
            sd = state_dict(*net.module);
          }
          if (rank0_only_and_offload && ctx.rank != 0) {
            if (wrap == Wrap::kNested) {
              EXPECT_TRUE(sd.empty()) << what;
              EXPECT_TRUE(sd.rank0_only_placeholder) << what;
            }
            continue;
          }
          EXPECT_EQ(sd.keys(), kNetKeys) << what;
          StateDict gathered;
          for (const auto& [key, value] : sd)
            gathered.insert(key, value.is_sharded() ? value.sharded_tensor().full_tensor() : value.tensor());
          Net blank = make_net(Wrap::kNone);
          zero_model(*blank.module);
          for (const auto& v : full_values(*blank.module)) ASSERT_EQ(v.abs().sum().item<double>(), 0.0) << what;
          auto result = load_state_dict(*blank.module, gathered);
          EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty()) << what;
          expect_equal_values(full_values(*blank.module), trained, what + ": plain model loaded");
          if (::testing::Test::HasFailure()) return;
        }
    // The plain model's state dict into the FSDP model.
    Net plain = make_net(Wrap::kNone);
    train(plain, 2, 0, 1);
    StateDict plain_sd = get_model_state_dict(*plain.module);
    for (Wrap wrap : {Wrap::kNested, Wrap::kRootOnly, Wrap::kSubmodules}) {
      Net net = make_net(wrap);
      zero_model(*net.module);
      auto scope = state_dict_type(*net.module, StateDictType::FULL_STATE_DICT);
      load_state_dict(*net.module, plain_sd);
      expect_equal_values(full_values(*net.module), full_values(*plain.module), name_of(wrap));
    }
  });
}

// The FULL state dict of a sharded model equals the plain model's bitwise; a model wrapped the
// same way, zeroed (checked), loads it back to the plain model's values.
void check_full_state_dict_save_load(Wrap wrap) {
  Net plain = make_net(Wrap::kNone);
  Net net = make_net(wrap);
  StateDict sd = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true));
  expect_full_sd_equals_plain(sd, *plain.module, name_of(wrap), /*exact=*/true);
  Net fresh = make_net(wrap);
  zero_model(*fresh.module);
  for (const auto& v : full_values(*fresh.module)) EXPECT_EQ(v.abs().sum().item<double>(), 0.0) << name_of(wrap) << " zeroed";
  set_model_state_dict(*fresh.module, sd);
  expect_equal_values(full_values(*fresh.module), full_values(*plain.module), name_of(wrap));
}

// Seed 002's CompositeParamModel and UnitModule (common_dist_composable.py), at dimension 8:
// l, then u1 and u2 (UnitModule: l1, seq = ReLU, Linear, ReLU, l2), then x @ p, with a persistent
// buffer. u1 and u2 are held in a ModuleList ("u.0", "u.1") so that a wrap policy can make them
// units (libtorch has no forward hooks: a typed member cannot be replaced by a policy).
struct UnitModuleImpl : torch::nn::Module {
  UnitModuleImpl() {
    l1 = register_module("l1", Linear(8, 8));
    seq = register_module("seq", Sequential(ReLU(), Linear(8, 8), ReLU()));
    l2 = register_module("l2", Linear(8, 8));
  }
  at::Tensor forward(at::Tensor x) { return l2->forward(seq->forward(l1->forward(x))); }
  Linear l1{nullptr}, l2{nullptr};
  Sequential seq{nullptr};
};
TORCH_MODULE(UnitModule);

struct CompositeParamModelImpl : torch::nn::Module {
  CompositeParamModelImpl() {
    torch::manual_seed(0);
    l = register_module("l", Linear(8, 8));
    u = register_module("u", torch::nn::ModuleList(UnitModule(), UnitModule()));
    p = register_parameter("p", torch::randn({8, 8}));
    buffer = register_buffer("buffer", torch::randn({8, 8}));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor a = l->forward(x);
    for (const auto& unit : *u) {
      if (auto* sharded = unit->as<FullyShardedDataParallelImpl<UnitModuleImpl>>())
        a = sharded->forward(a);
      else
        a = unit->as<UnitModuleImpl>()->forward(a);
    }
    return torch::mm(a, p) + buffer.select(0, 0);
  }
  Linear l{nullptr};
  torch::nn::ModuleList u{nullptr};
  at::Tensor p, buffer;
};
TORCH_MODULE(CompositeParamModel);

// Seed 002 test_state_dict_save_load_root_fully_shard: fully_shard on the root of the seed's
// CompositeParamModel with ModuleWrapPolicy({UnitModule}) (three units: u.0, u.1 and the root),
// and the one-unit model of the other tests. The FULL state dict equals the plain model's
// bitwise (buffer included); a model wrapped the same way, its parameters and buffer zeroed
// (checked), loads it back to the saved model's values and computes the plain model's output.
TEST_P(FSDPStateDict, StateDictSaveLoadRootFullyShard) {
  run_ranks(GetParam(), [](RankContext&) {
    check_full_state_dict_save_load(Wrap::kRootOnly);
    CompositeParamModel local;
    const auto policy = FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<UnitModuleImpl>());
    auto save = fully_shard(CompositeParamModel(), policy);
    ASSERT_EQ(fsdp_units(*save).size(), 3u);
    const StateDict local_sd = get_model_state_dict(*local.ptr());
    const StateDict sd = get_model_state_dict(*save, StateDictOptions().full_state_dict(true));
    ASSERT_EQ(sd.keys(), local_sd.keys());
    EXPECT_NE(sd.find("u.1.seq.1.weight"), nullptr);
    EXPECT_NE(sd.find("buffer"), nullptr);
    for (const auto& [key, value] : local_sd) EXPECT_TRUE(at::equal(sd.at(key).tensor(), value.tensor())) << key;

    auto load = fully_shard(CompositeParamModel(), policy);
    zero_model(*load);
    for (const auto& v : full_values(*load)) ASSERT_EQ(v.abs().sum().item<double>(), 0.0) << "zeroed";
    StateDict copy;
    for (const auto& [key, value] : sd) copy.insert(key, value.tensor().clone());
    set_model_state_dict(*load, copy);
    expect_equal_values(full_values(*load), full_values(*save), "CompositeParamModel loaded");
    torch::manual_seed(5);
    const at::Tensor x = torch::randn({3, 8});
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(load->forward(x), local->forward(x), kRtol, kAtol)) << "the loaded model computes the plain one's output";
  });
}

// Seed 002 test_state_dict_save_load_submodule_fully_shard: units on submodules, a plain root.
TEST_P(FSDPStateDict, StateDictSaveLoadSubmoduleFullyShard) {
  run_ranks(GetParam(), [](RankContext&) { check_full_state_dict_save_load(Wrap::kSubmodules); });
}

// The plain model's names of the trained values (parameters, then the buffer), read through
// the engine's own all-gather (full_values), for comparing state dicts entry by entry.
std::map<std::string, at::Tensor> named_full_values(Net& net) {
  const auto values = full_values(*net.module);
  Net plain = make_net(Wrap::kNone);
  std::vector<std::string> names;
  for (const auto& item : plain.module->named_parameters()) names.push_back(item.key());
  for (const auto& item : plain.module->named_buffers()) names.push_back(item.key());
  EXPECT_EQ(names.size(), values.size());
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) out[names[i]] = values[i];
  return out;
}

// Seed 000 test_save_and_load_after_forward_state_dict: 6 training steps change every
// parameter; a further forward (grad mode on, no backward) leaves the root's parameters
// unsharded (FSDP2's root does not reshard after forward) while the inner units reshard; the state dict taken then holds exactly the
// trained values (checked entry by entry against the parameters; LOCAL's flat parameter against
// its unit's parameters concatenated), all float32; zeroing the model and loading the dict
// brings the trained values back. FULL also with rank0_only + offload (rank 0 broadcasts).
TEST_P(FSDPStateDict, SaveAndLoadAfterForwardStateDict) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    for (StateDictType type : kAllTypes)
      for (bool rank0_and_offload : {false, true}) {
        if (rank0_and_offload && type != StateDictType::FULL_STATE_DICT) continue;
        const std::string what = std::string(to_string(type)) + (rank0_and_offload ? " rank0_only+offload" : "");
        Net net = make_net(Wrap::kNested);
        const auto initial = named_full_values(net);
        train(net, 6, ctx.rank, n);
        const auto trained = named_full_values(net);
        for (const auto& key : kNetParamKeys)
          EXPECT_FALSE(at::equal(trained.at(key), initial.at(key))) << what << ": training did not change " << key;

        // A forward with grad mode on and no backward (one under NoGradGuard reshards every unit,
        // the root too, since no backward follows it).
        torch::manual_seed(7);
        net.forward(torch::randn({4, 7}));
        // The root (it shards 5.*) is unsharded now; the inner units (0.*, 3.*) resharded.
        auto units = fsdp_units(*net.module);
        ASSERT_EQ(units.size(), 3u);
        auto param = [](FSDPModule* unit, const std::string& name) -> at::Tensor {
          for (const auto& p : unit->sharded_parameters())
            if (p.name == name) return p.param;
          ADD_FAILURE() << "no parameter " << name;
          return at::Tensor();
        };
        const at::Tensor root_weight = param(units[0], "5.weight"), inner_weight = param(units[2], "weight");
        ASSERT_TRUE(root_weight.defined() && inner_weight.defined());
        EXPECT_EQ(root_weight.sizes(), (std::vector<int64_t>{3, 15})) << what << ": root unsharded after forward";
        EXPECT_TRUE(at::equal(root_weight.detach(), trained.at("5.weight"))) << what;
        EXPECT_EQ(param(units[0], "5.bias").sizes(), (std::vector<int64_t>{3})) << what;
        const int64_t chunk = (15 + n - 1) / n;
        const int64_t rows = std::max<int64_t>(0, std::min<int64_t>(chunk, 15 - ctx.rank * chunk));
        EXPECT_EQ(inner_weight.sizes(), (std::vector<int64_t>{rows, 15})) << what << ": inner unit resharded";

        std::optional<StateDictConfig> config;
        if (rank0_and_offload) config = FullStateDictConfig().rank0_only(true).offload_to_cpu(true);
        StateDict sd;
        {
          auto scope = state_dict_type(*net.module, type, config);
          sd = state_dict(*net.module);
        }
        EXPECT_EQ(root_weight.sizes(), (std::vector<int64_t>{3, 15})) << what << ": taking the dict keeps the root unsharded";
        // The dict against the trained values, entry by entry.
        auto whole = [](const StateDictValue& v) { return v.is_sharded() ? v.sharded_tensor().full_tensor() : v.tensor(); };
        if (rank0_and_offload && ctx.rank != 0) {
          EXPECT_TRUE(sd.empty()) << what;
        } else if (type == StateDictType::LOCAL_STATE_DICT) {
          EXPECT_EQ(sd.keys(), (std::vector<std::string>{"_flat_param", "0._flat_param", "2.scale", "3._flat_param"}));
          auto flat = [&](const std::string& unit) {
            return at::cat({trained.at(unit + ".weight").flatten(), trained.at(unit + ".bias").flatten()});
          };
          const std::map<std::string, at::Tensor> expected{
              {"_flat_param", flat("5")}, {"0._flat_param", flat("0")}, {"3._flat_param", flat("3")}, {"2.scale", trained.at("2.scale")}};
          for (const auto& [key, value] : expected) {
            ASSERT_NE(sd.find(key), nullptr) << what << " " << key;
            EXPECT_EQ(sd.at(key).is_sharded() ? sd.at(key).sharded_tensor().dtype() : sd.at(key).tensor().scalar_type(), at::kFloat);
            EXPECT_TRUE(at::equal(whole(sd.at(key)), value)) << what << " " << key;
          }
        } else {
          ASSERT_EQ(sd.keys(), kNetKeys) << what;
          for (const auto& key : kNetKeys) {
            at::Tensor value = whole(sd.at(key));
            EXPECT_EQ(value.scalar_type(), at::kFloat) << what << " " << key;
            EXPECT_TRUE(at::equal(value, trained.at(key))) << what << " " << key;
          }
        }

        units[0]->reshard();  // zero the shards themselves (the root's gathered copy is dropped on reshard)
        zero_model(*net.module);
        for (const auto& [key, value] : named_full_values(net)) EXPECT_EQ(value.abs().sum().item<double>(), 0.0) << key;
        if (rank0_and_offload) {
          set_model_state_dict(*net.module, sd, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
        } else {
          auto scope = state_dict_type(*net.module, type);
          load_state_dict(*net.module, sd);
        }
        const auto loaded = named_full_values(net);
        for (const auto& [key, value] : trained) EXPECT_TRUE(at::equal(loaded.at(key), value)) << what << " loaded " << key;
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Seed 000 test_wrong_state_dict_config: a config of another kind than the type is refused.
TEST_P(FSDPStateDict, WrongStateDictConfig) {
  run_ranks(GetParam(), [](RankContext&) {
    Net net = make_net(Wrap::kNested);
    EXPECT_NE(error_of([&] { auto s = state_dict_type(*net.module, StateDictType::FULL_STATE_DICT, LocalStateDictConfig()); })
                  .find("expected state_dict_config of type FullStateDictConfig but got LocalStateDictConfig"),
              std::string::npos);
    EXPECT_NE(error_of([&] { auto s = state_dict_type(*net.module, StateDictType::SHARDED_STATE_DICT, FullStateDictConfig()); })
                  .find("expected state_dict_config of type ShardedStateDictConfig but got FullStateDictConfig"),
              std::string::npos);
    // The refused scope changed nothing.
    EXPECT_EQ(get_state_dict_type(*net.module).state_dict_type, StateDictType::FULL_STATE_DICT);
    for (auto* u : fsdp_units(*net.module)) EXPECT_EQ(get_state_dict_type(*u).state_dict_type, StateDictType::FULL_STATE_DICT);
  });
}

// Seed 000 test_state_dict_type: a scoped type applies to every unit and reverts to FULL after
// the scope; scopes nest; set_state_dict_type returns the previous settings.
TEST_P(FSDPStateDict, StateDictType) {
  run_ranks(GetParam(), [](RankContext&) {
    Net net = make_net(Wrap::kNested);
    EXPECT_EQ(get_state_dict_type(*net.module).state_dict_type, StateDictType::FULL_STATE_DICT);
    {
      auto scope = state_dict_type(*net.module, StateDictType::LOCAL_STATE_DICT);
      for (auto* u : fsdp_units(*net.module)) EXPECT_EQ(get_state_dict_type(*u).state_dict_type, StateDictType::LOCAL_STATE_DICT);
      EXPECT_TRUE(state_dict(*net.module).at("_flat_param").is_sharded()) << "the scope's type is what state_dict takes";
      {
        auto inner = state_dict_type(*net.module, StateDictType::SHARDED_STATE_DICT, ShardedStateDictConfig());
        EXPECT_EQ(get_state_dict_type(*net.module).state_dict_type, StateDictType::SHARDED_STATE_DICT);
      }
      EXPECT_EQ(get_state_dict_type(*net.module).state_dict_type, StateDictType::LOCAL_STATE_DICT);
    }
    for (auto* u : fsdp_units(*net.module)) EXPECT_EQ(get_state_dict_type(*u).state_dict_type, StateDictType::FULL_STATE_DICT);
    EXPECT_EQ(state_dict(*net.module).keys(), kNetKeys);
    StateDictSettings previous = set_state_dict_type(*net.module, StateDictType::SHARDED_STATE_DICT);
    EXPECT_EQ(previous.state_dict_type, StateDictType::FULL_STATE_DICT);
    EXPECT_EQ(set_state_dict_type(*net.module, StateDictType::FULL_STATE_DICT).state_dict_type,
              StateDictType::SHARDED_STATE_DICT);
  });
}

// Seed 000 test_local_state_dict_with_empty_ranks: a one-element parameter (ranks > 0 hold none).
struct OneParamImpl : torch::nn::Module {
  OneParamImpl() { my_parameter = register_parameter("my_parameter", torch::full({1}, 3.1415926)); }
  at::Tensor forward(at::Tensor x) { return my_parameter * x.sum(); }
  at::Tensor my_parameter;
};
TORCH_MODULE(OneParam);

TEST_P(FSDPStateDict, LocalStateDictWithEmptyRanks) {
  run_ranks(GetParam(), [](RankContext&) {
    FullyShardedDataParallel<OneParamImpl> model(OneParam{});
    model->forward(torch::ones({2})).sum().backward();
    auto scope = state_dict_type(*model, StateDictType::LOCAL_STATE_DICT);
    StateDict sd = state_dict(*model);
    ASSERT_EQ(sd.keys(), std::vector<std::string>{"_flat_param"});
    EXPECT_EQ(sd.at("_flat_param").sharded_tensor().size(), std::vector<int64_t>{1});
    model->unshard();
    EXPECT_FLOAT_EQ(model->module()->my_parameter.item<float>(), 3.1415926f);
    model->reshard();
    zero_model(*model);
    model->unshard();
    EXPECT_FLOAT_EQ(model->module()->my_parameter.item<float>(), 0.f);
    model->reshard();
    load_state_dict(*model, sd);
    model->unshard();
    EXPECT_FLOAT_EQ(model->module()->my_parameter.item<float>(), 3.1415926f);
    model->reshard();
  });
}

// A FULL state dict through torch::save / torch::load: keys, type and values survive, and the
// loaded dict loads into a zeroed model.
TEST_P(FSDPStateDict, TorchSaveLoadFullStateDict) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    train(net, 1, ctx.rank, ctx.world_size);
    StateDict sd = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true));
    const std::string path = ctx.temp_dir + "/full_" + std::to_string(ctx.rank) + ".pt";
    torch::save(sd, path);
    StateDict loaded;
    torch::load(loaded, path);
    EXPECT_EQ(loaded.keys(), sd.keys());
    EXPECT_EQ(loaded.type, StateDictType::FULL_STATE_DICT);
    for (const auto& [key, value] : sd) EXPECT_TRUE(at::equal(loaded.at(key).tensor(), value.tensor())) << key;
    Net fresh = make_net(Wrap::kNested);
    zero_model(*fresh.module);
    load_state_dict(*fresh.module, loaded);
    expect_equal_values(full_values(*fresh.module), full_values(*net.module), "loaded from file");
  });
}

// Seed 000 test_torch_save_load: a LOCAL (and a SHARDED) state dict through torch::save and
// torch::load, one file per rank: every local shard and the layout survive, and the loaded dict
// loads into a zeroed model. A rank's file is refused by another rank (naming both), and a
// ShardedTensor over a subgroup is refused by torch::save, which writes nothing.
TEST_P(FSDPStateDict, TorchSaveLoad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    train(net, 1, ctx.rank, ctx.world_size);
    const auto trained = full_values(*net.module);
    for (StateDictType type : {StateDictType::LOCAL_STATE_DICT, StateDictType::SHARDED_STATE_DICT}) {
      SCOPED_TRACE(to_string(type));
      auto scope = state_dict_type(*net.module, type);
      StateDict sd = state_dict(*net.module);
      const auto path = [&](int rank) { return ctx.temp_dir + "/" + to_string(type) + "_" + std::to_string(rank) + ".pt"; };
      torch::save(sd, path(ctx.rank));
      StateDict loaded;
      torch::load(loaded, path(ctx.rank));
      EXPECT_EQ(loaded.keys(), sd.keys());
      EXPECT_EQ(loaded.type, type);
      size_t sharded = 0;
      for (const auto& [key, value] : sd) {
        ASSERT_EQ(loaded.at(key).is_sharded(), value.is_sharded()) << key;
        if (!value.is_sharded()) {
          EXPECT_TRUE(at::equal(loaded.at(key).tensor(), value.tensor())) << key;
          continue;
        }
        ++sharded;
        const ShardedTensor &a = loaded.at(key).sharded_tensor(), &b = value.sharded_tensor();
        EXPECT_EQ(a.size(), b.size()) << key;
        EXPECT_EQ(a.shards_metadata(), b.shards_metadata()) << key;
        ASSERT_EQ(a.local_shards().size(), b.local_shards().size()) << key;
        for (size_t i = 0; i < a.local_shards().size(); ++i) {
          EXPECT_EQ(a.local_shards()[i].metadata, b.local_shards()[i].metadata) << key;
          EXPECT_TRUE(at::equal(a.local_shards()[i].tensor, b.local_shards()[i].tensor)) << key;
        }
      }
      EXPECT_GT(sharded, 0u) << "the dict holds no ShardedTensor: the round trip tested nothing sharded";
      zero_model(*net.module);
      load_state_dict(*net.module, loaded);
      expect_equal_values(full_values(*net.module), trained, "loaded from this rank's file");

      if (ctx.world_size > 1) {
        fsdpp::barrier();  // every rank's file is written
        const int other = (ctx.rank + 1) % ctx.world_size;
        StateDict wrong;
        const std::string e = error_of([&] { torch::load(wrong, path(other)); });
        EXPECT_NE(e.find("saved by rank " + std::to_string(other) + " of " + std::to_string(ctx.world_size) +
                         ", and this process is rank " + std::to_string(ctx.rank)),
                  std::string::npos) << e;
        fsdpp::barrier();  // no rank moves on (rewriting its file) while another still reads it
      }
    }
    if (ctx.world_size > 1) {
      // All ranks but the last: a ShardedTensor torch::load could not rebuild over the default group.
      std::vector<int> ranks(ctx.world_size - 1);
      std::iota(ranks.begin(), ranks.end(), 0);
      ProcessGroup sub = default_group().new_group(ranks);
      if (!sub.is_member()) return;
      StateDict sd;
      sd.insert("w", ShardedTensor::from_local_shards(
                         {Shard::from_tensor_and_offsets(at::ones({2, 3}), {2 * sub.rank(), 0}, sub.rank())},
                         {2 * sub.size(), 3}, sub));
      const std::string path = ctx.temp_dir + "/subgroup_" + std::to_string(ctx.rank) + ".pt";
      const std::string e = error_of([&] { torch::save(sd, path); });
      EXPECT_NE(e.find("'w' is a ShardedTensor over process group " + sub.name() + " (" + std::to_string(sub.size()) +
                       " of " + std::to_string(ctx.world_size) + " ranks)"),
                std::string::npos) << e;
      EXPECT_NE(e.find("distributed checkpoint"), std::string::npos) << e;
      std::ifstream written(path, std::ios::binary | std::ios::ate);
      EXPECT_TRUE(!written || written.tellg() == 0) << path << " holds a partial archive";
    }
  });
}

// Seed 000 test_shared_module_and_shared_parameter (TestDummyModel): a module registered twice
// and a parameter registered under two names appear under every name, equal, and load.
struct DummyImpl : torch::nn::Module {
  DummyImpl() {
    torch::manual_seed(0);
    net1 = register_module("net1", Sequential(Linear(8, 16), ReLU()));
    net2 = register_module("net2", Sequential(Linear(16, 16), ReLU()));
    net3 = register_module("net3", net2);
    random_parameter = register_parameter("random_parameter", torch::randn({10}));
    register_parameter("shared_parameter", random_parameter);
  }
  at::Tensor forward(at::Tensor x) { return net3->forward(net2->forward(net1->forward(x))).sum() + random_parameter.sum(); }
  Sequential net1{nullptr}, net2{nullptr}, net3{nullptr};
  at::Tensor random_parameter;
};
TORCH_MODULE(Dummy);

TEST_P(FSDPStateDict, SharedModuleAndSharedParameter) {
  run_ranks(GetParam(), [](RankContext&) {
    FullyShardedDataParallel<DummyImpl> model(Dummy{});
    Dummy plain;
    StateDict sd = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
    EXPECT_EQ(sd.keys(), (std::vector<std::string>{"random_parameter", "shared_parameter", "net1.0.weight", "net1.0.bias",
                                                   "net2.0.weight", "net2.0.bias", "net3.0.weight", "net3.0.bias"}));
    EXPECT_TRUE(at::equal(sd.at("random_parameter").tensor(), sd.at("shared_parameter").tensor()));
    EXPECT_TRUE(at::equal(sd.at("net2.0.weight").tensor(), sd.at("net3.0.weight").tensor()));
    EXPECT_TRUE(at::equal(sd.at("net2.0.bias").tensor(), sd.at("net3.0.bias").tensor()));
    EXPECT_TRUE(at::equal(sd.at("random_parameter").tensor(), plain->random_parameter));
    for (StateDictType type : kAllTypes) {
      auto scope = state_dict_type(*model, type);
      StateDict typed = state_dict(*model);
      zero_model(*model);
      load_state_dict(*model, typed);
      StateDict again = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
      for (const auto& [key, value] : sd) EXPECT_TRUE(at::equal(again.at(key).tensor(), value.tensor())) << to_string(type) << " " << key;
    }
    zero_model(*plain);
    load_state_dict(*plain, sd);
    EXPECT_TRUE(at::equal(plain->net3[0]->as<torch::nn::Linear>()->weight, sd.at("net3.0.weight").tensor()));
  });
}

// Seed 000 test_full_state_dict_missing_unexpected_keys_cleaned: non-strict loads report
// plain keys; strict loads list them in the error.
TEST_P(FSDPStateDict, FullStateDictMissingUnexpectedKeysCleaned) {
  run_ranks(GetParam(), [](RankContext&) {
    Net net = make_net(Wrap::kNested);
    StateDict sd = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true));
    sd.erase("0.weight");
    sd.insert("unexpected", torch::ones({1}));
    auto result = load_state_dict(*net.module, sd, /*strict=*/false);
    EXPECT_EQ(result.missing_keys, std::vector<std::string>{"0.weight"});
    EXPECT_EQ(result.unexpected_keys, std::vector<std::string>{"unexpected"});
    const std::string error = error_of([&] { load_state_dict(*net.module, sd); });
    EXPECT_NE(error.find("unexpected key(s) in state_dict: 'unexpected'"), std::string::npos) << error;
    EXPECT_NE(error.find("missing key(s) in state_dict: '0.weight'"), std::string::npos) << error;
    EXPECT_EQ(error.find("_fsdp_wrapped_module"), std::string::npos) << error;
  });
}

// Bad input: every failed load names what was wrong and leaves the model unchanged.
TEST_P(FSDPStateDict, LoadErrorsLeaveModelUnchanged) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    Net other = make_net(Wrap::kNested);
    train(other, 1, ctx.rank, ctx.world_size);  // a valid dict with other values
    const auto before = full_values(*net.module);
    auto unchanged = [&](const std::string& what) { expect_equal_values(full_values(*net.module), before, what); };
    StateDict full = get_model_state_dict(*other.module, StateDictOptions().full_state_dict(true));
    StateDict sharded = get_model_state_dict(*other.module);

    {  // Shape mismatch, after valid entries that would be written first.
      StateDict bad = full;
      bad.set("5.weight", torch::zeros({4, 15}));
      const std::string e = error_of([&] { load_state_dict(*net.module, bad); });
      EXPECT_NE(e.find("'5.weight'"), std::string::npos) << e;
      EXPECT_NE(e.find("[4, 15]"), std::string::npos) << e;
      EXPECT_NE(e.find("[3, 15]"), std::string::npos) << e;
      unchanged("shape mismatch");
    }
    {  // A SHARDED dict while the model's type is FULL, and the reverse.
      const std::string e = error_of([&] { load_state_dict(*net.module, sharded); });
      EXPECT_NE(e.find("SHARDED_STATE_DICT but the model's state_dict_type is FULL_STATE_DICT"), std::string::npos) << e;
      StateDict untyped = sharded;
      untyped.type.reset();
      const std::string e2 = error_of([&] { load_state_dict(*net.module, untyped); });
      EXPECT_NE(e2.find("'0.weight' is a ShardedTensor but the model's state_dict_type is FULL_STATE_DICT"), std::string::npos) << e2;
      auto scope = state_dict_type(*net.module, StateDictType::SHARDED_STATE_DICT);
      StateDict untyped_full = full;
      untyped_full.type.reset();
      const std::string e3 = error_of([&] { load_state_dict(*net.module, untyped_full); });
      EXPECT_NE(e3.find("'0.weight' is a whole tensor but the model's state_dict_type is SHARDED_STATE_DICT"), std::string::npos) << e3;
      unchanged("wrong kind");
    }
    {  // A FULL dict under LOCAL.
      auto scope = state_dict_type(*net.module, StateDictType::LOCAL_STATE_DICT);
      StateDict untyped_full = full;
      untyped_full.type.reset();
      const std::string e = error_of([&] { load_state_dict(*net.module, untyped_full); });
      EXPECT_NE(e.find("LOCAL_STATE_DICT"), std::string::npos) << e;
      EXPECT_NE(e.find("'0.weight'"), std::string::npos) << e;
      unchanged("FULL under LOCAL");
    }
    {  // Unknown keys in strict mode.
      StateDict bad = full;
      bad.insert("0.extra", torch::zeros({1}));
      bad.insert("9.weight", torch::zeros({1}));
      const std::string e = error_of([&] { load_state_dict(*net.module, bad); });
      EXPECT_NE(e.find("'0.extra', '9.weight'"), std::string::npos) << e;
      unchanged("unknown keys");
    }
    {  // The empty dict rank0_only gives other ranks.
      StateDict r0 = get_model_state_dict(*other.module, StateDictOptions().full_state_dict(true).cpu_offload(true));
      if (ctx.rank != 0) {
        const std::string e = error_of([&] { load_state_dict(*net.module, r0); });
        EXPECT_NE(e.find("rank0_only"), std::string::npos) << e;
        EXPECT_NE(e.find("rank " + std::to_string(ctx.rank)), std::string::npos) << e;
      } else {
        EXPECT_EQ(r0.keys(), kNetKeys);
      }
      unchanged("rank0_only");
      // With broadcast_from_rank0 every rank loads rank 0's dict.
      set_model_state_dict(*net.module, r0, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
      expect_equal_values(full_values(*net.module), full_values(*other.module), "broadcast_from_rank0");
    }
  });
}

// Seed 000 test_world_size_one: every rank shards over a group of its own.
TEST_P(FSDPStateDict, WorldSizeOne) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    ProcessGroup mine;
    for (int i = 0; i < ctx.world_size; ++i) {
      ProcessGroup g = ctx.world.new_group({i});
      if (i == ctx.rank) mine = g;
    }
    Net net = make_net(Wrap::kNested, FullyShardOptions().process_group(mine));
    train(net, 2, 0, 1);
    auto trained = full_values(*net.module);
    auto scope = state_dict_type(*net.module, StateDictType::SHARDED_STATE_DICT);
    StateDict sd = state_dict(*net.module);
    EXPECT_EQ(sd.at("0.weight").sharded_tensor().local_shards().at(0).tensor.sizes(), (std::vector<int64_t>{15, 7}));
    zero_model(*net.module);
    load_state_dict(*net.module, sd);
    expect_equal_values(full_values(*net.module), trained, "group of size one");
    barrier(ctx.world);
  });
}


// Seed 000 test_basic_save_and_load_state_dict: each kind (FULL also with rank0_only + offload)
// taken from a trained model whose buffer was changed too loads into a model that differs from
// it in every element of every parameter and buffer before the load, and equals it in all of
// them after (strict load, as the seed).
TEST_P(FSDPStateDict, BasicSaveAndLoadStateDict) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (StateDictType type : kAllTypes)
      for (bool rank0_and_offload : {false, true}) {
        if (rank0_and_offload && type != StateDictType::FULL_STATE_DICT) continue;
        const std::string what = std::string(to_string(type)) + (rank0_and_offload ? " rank0_only+offload" : "");
        Net net = make_net(Wrap::kNested);
        train(net, 2, ctx.rank, ctx.world_size);
        {  // The buffer no longer holds its initial value either (the seed's persistent buffers).
          torch::NoGradGuard no_grad;
          for (auto& b : net.module->buffers()) b.mul_(2).add_(0.5);
        }
        const auto source = full_values(*net.module);
        ASSERT_EQ(source.size(), 7u) << "six parameters and one buffer";
        std::optional<StateDictConfig> config;
        if (rank0_and_offload) config = FullStateDictConfig().rank0_only(true).offload_to_cpu(true);
        StateDict sd;
        {
          auto scope = state_dict_type(*net.module, type, config);
          sd = state_dict(*net.module);
        }
        EXPECT_EQ(sd.empty(), rank0_and_offload && ctx.rank != 0) << what;

        Net other = make_net(Wrap::kNested);
        {
          torch::NoGradGuard no_grad;
          torch::manual_seed(123);  // after make_net, which seeds its own initialisation
          for (auto& p : other.module->parameters()) p.uniform_(-1, 1);
          for (auto& b : other.module->buffers()) b.uniform_(-1, 1);
        }
        const auto before = full_values(*other.module);
        ASSERT_EQ(before.size(), source.size());
        for (size_t i = 0; i < before.size(); ++i)
          EXPECT_TRUE(at::all(before[i] != source[i]).item<bool>()) << what << ": #" << i << " equals the source before the load";
        if (rank0_and_offload) {
          // Only rank 0 holds the values: it broadcasts them.
          set_model_state_dict(*other.module, sd, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
        } else {
          auto scope = state_dict_type(*other.module, type);
          auto result = load_state_dict(*other.module, sd);
          EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty()) << what;
        }
        expect_equal_values(full_values(*other.module), source, what + " after the load");
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// Seed 000 test_state_dict_with_shared_parameters: TransformerWithSharedParams (here the example
// transformer with its output projection tied to the token embedding), wrapped per block by
// ModuleWrapPolicy and the root. Its FULL / SHARDED / LOCAL state dict loads into a model built
// the same way with every parameter zeroed (checked), which then holds the source's values with
// the tie intact; the FULL dict equals the plain model's under the plain model's keys.
TEST_P(FSDPStateDict, StateDictWithSharedParameters) {
  run_ranks(GetParam(), [](RankContext&) {
    examples::TransformerArgs args;
    args.weight_tying = true;
    auto make = [&] {
      torch::manual_seed(0);
      return fully_shard(examples::Transformer(args),
                         FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<examples::TransformerBlockImpl>()));
    };
    torch::manual_seed(0);
    examples::Transformer plain(args);
    const StateDict plain_sd = get_model_state_dict(*plain.ptr());
    for (StateDictType type : kAllTypes) {
      const std::string what = to_string(type);
      auto source = make();
      ASSERT_EQ(fsdp_units(*source).size(), static_cast<size_t>(args.n_layers + 1)) << "a unit per block and the root";
      StateDict sd;
      {
        auto scope = state_dict_type(*source, type);
        sd = state_dict(*source);
      }
      if (type == StateDictType::FULL_STATE_DICT) {
        EXPECT_EQ(sd.keys(), plain_sd.keys());
        EXPECT_NE(sd.find("output.weight"), nullptr) << "the tied weight under both names";
        for (const auto& [key, value] : plain_sd) EXPECT_TRUE(at::equal(sd.at(key).tensor(), value.tensor())) << key;
      }
      auto target = make();
      zero_model(*target);
      for (const auto& v : full_values(*target)) ASSERT_EQ(v.abs().sum().item<double>(), 0.0) << what << ": zeroed";
      {
        auto scope = state_dict_type(*target, type);
        auto result = load_state_dict(*target, sd);
        EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty()) << what;
      }
      expect_equal_values(full_values(*target), full_values(*source), what + " loaded");
      EXPECT_TRUE(target->module()->output->weight.is_same(target->module()->tok_embeddings->weight)) << what << ": tie kept";
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// Seed 000 test_state_dict_rank0_offload_save_load_flow: rank 0's FULL dict (rank0_only +
// offload) loads into a plain model on rank 0 and, through broadcast_from_rank0, into a fresh
// FSDP model on every rank.
TEST_P(FSDPStateDict, StateDictRank0OffloadSaveLoadFlow) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    train(net, 2, ctx.rank, ctx.world_size);
    const auto trained = full_values(*net.module);
    StateDict sd = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true).cpu_offload(true));
    EXPECT_EQ(sd.empty(), ctx.rank != 0);
    // The seed's last leg: the plain model only rank 0 loaded, wrapped on every rank with
    // sync_module_states, holds rank 0's values everywhere (the others' are zeros before).
    Net plain = make_net(Wrap::kNone);
    zero_model(*plain.module);
    if (ctx.rank == 0) {
      set_model_state_dict(*plain.module, sd);
      expect_equal_values(full_values(*plain.module), trained, "plain on rank 0");
    }
    FSDPSequential synced(Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(plain.module)),
                          FullyShardOptions().sync_module_states(true));
    expect_equal_values(full_values(*synced.ptr()), trained, "plain model loaded on rank 0, wrapped with sync_module_states");
    Net fresh = make_net(Wrap::kNested);
    zero_model(*fresh.module);
    set_model_state_dict(*fresh.module, sd, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
    expect_equal_values(full_values(*fresh.module), trained, "FSDP model, broadcast from rank 0");
    // The fresh model trains on as the original does.
    train(fresh, 1, ctx.rank, ctx.world_size);
    train(net, 1, ctx.rank, ctx.world_size);
    expect_equal_values(full_values(*fresh.module), full_values(*net.module), "after one more step");
  });
}

// ---- optimizer state dicts ------------------------------------------------------------------

torch::optim::AdamOptions adam_options() { return torch::optim::AdamOptions(1e-2); }

// The FULL optimizer state dict of an FSDP model equals the reference optimizer's state, keyed
// by the plain parameter names; a SHARDED one holds this rank's rows.
TEST_P(FSDPStateDict, OptimizerStateDictFullAndSharded) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net ref = make_net(Wrap::kNone);
    torch::optim::Adam ref_opt(ref.module->parameters(), adam_options());
    train_with(ref, ref_opt, 0, 3, 0, 1);
    for (Wrap wrap : {Wrap::kNested, Wrap::kSubmodules}) {
      Net net = make_net(wrap);
      torch::optim::Adam opt(net.module->parameters(), adam_options());
      train_with(net, opt, 0, 3, ctx.rank, ctx.world_size);
      OptimizerStateDict osd = get_optimizer_state_dict(*net.module, opt, StateDictOptions().full_state_dict(true));
      ASSERT_EQ(osd.param_groups.size(), 1u);
      EXPECT_EQ(osd.param_groups[0].params, kNetParamKeys);
      ASSERT_EQ(osd.state.size(), kNetParamKeys.size());
      auto ref_params = ref.module->named_parameters();
      for (const auto& key : kNetParamKeys) {
        const auto& entries = osd.state.at(key);
        EXPECT_EQ(entries.keys(), (std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"})) << key;
        EXPECT_EQ(entries.at("step").tensor().item<int64_t>(), 3) << key;
        const auto& ref_state = static_cast<const torch::optim::AdamParamState&>(
            *ref_opt.state().at(fsdpp::compat::optimizer_state_key(ref_params[key])));
        expect_close(entries.at("exp_avg").tensor(), ref_state.exp_avg(), std::string(name_of(wrap)) + " exp_avg " + key);
        expect_close(entries.at("exp_avg_sq").tensor(), ref_state.exp_avg_sq(), std::string(name_of(wrap)) + " exp_avg_sq " + key);
      }
      // SHARDED: each FSDP parameter's state as its rows; round trip into a fresh optimizer
      // continues exactly as the original.
      // The ranks agree on which states exist with one all_reduce per process group (all units
      // here shard over the world), not one per parameter.
      CommDebugMode comm;
      OptimizerStateDict sharded = get_optimizer_state_dict(*net.module, opt);
      EXPECT_EQ(comm.count("all_reduce"), ctx.world_size > 1 ? 1 : 0) << name_of(wrap);
      const auto& exp_avg = sharded.state.at("3.weight").at("exp_avg");
      ASSERT_TRUE(exp_avg.is_sharded());
      EXPECT_TRUE(at::equal(exp_avg.sharded_tensor().full_tensor(), osd.state.at("3.weight").at("exp_avg").tensor()));
      StateDict model_sd = get_model_state_dict(*net.module);
      Net twin = make_net(wrap);
      torch::optim::Adam twin_opt(twin.module->parameters(), torch::optim::AdamOptions(0.5));
      set_model_state_dict(*twin.module, model_sd);
      set_optimizer_state_dict(*twin.module, twin_opt, sharded);
      EXPECT_DOUBLE_EQ(twin_opt.param_groups()[0].options().get_lr(), 1e-2);
      train_with(net, opt, 3, 2, ctx.rank, ctx.world_size);
      train_with(twin, twin_opt, 3, 2, ctx.rank, ctx.world_size);
      expect_equal_values(full_values(*twin.module), full_values(*net.module), std::string(name_of(wrap)) + " resumed");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// A fresh optimizer's state, initialized, is a template a checkpoint load fills in place
// through the flattened view; loading it continues training exactly as the original.
TEST_P(FSDPStateDict, OptimizerStateDictInitAndFlattenForInPlaceLoad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    torch::optim::Adam opt(net.module->parameters(), adam_options());
    train_with(net, opt, 0, 2, ctx.rank, ctx.world_size);
    const StateDict saved = flatten_optimizer_state(get_optimizer_state_dict(*net.module, opt));
    StateDict model_sd = get_model_state_dict(*net.module);

    Net twin = make_net(Wrap::kNested);
    set_model_state_dict(*twin.module, model_sd);
    torch::optim::Adam twin_opt(twin.module->parameters(), adam_options());
    init_optimizer_state(twin_opt);
    OptimizerStateDict osd = get_optimizer_state_dict(*twin.module, twin_opt);
    EXPECT_EQ(osd.state.size(), kNetParamKeys.size());
    StateDict flat = flatten_optimizer_state(osd);
    EXPECT_EQ(flat.keys(), saved.keys());
    EXPECT_NE(flat.find("state.3.weight.exp_avg"), nullptr);
    // What checkpoint::load does: copy into the template's (local) tensors in place.
    for (const auto& [key, value] : saved) {
      const StateDictValue& into = flat.at(key);
      if (value.is_tensor()) {
        into.tensor().copy_(value.tensor());
      } else {
        ASSERT_EQ(into.sharded_tensor().local_shards().size(), value.sharded_tensor().local_shards().size()) << key;
        for (size_t i = 0; i < value.sharded_tensor().local_shards().size(); ++i)
          into.sharded_tensor().local_shards()[i].tensor.copy_(value.sharded_tensor().local_shards()[i].tensor);
      }
    }
    set_optimizer_state_dict(*twin.module, twin_opt, osd);
    train_with(net, opt, 2, 2, ctx.rank, ctx.world_size);
    train_with(twin, twin_opt, 2, 2, ctx.rank, ctx.world_size);
    expect_equal_values(full_values(*twin.module), full_values(*net.module), "resumed from the filled template");

    // init_optimizer_state changes nothing for Adam: a fresh pair trains identically.
    Net a = make_net(Wrap::kNested), b = make_net(Wrap::kNested);
    torch::optim::Adam oa(a.module->parameters(), adam_options()), ob(b.module->parameters(), adam_options());
    init_optimizer_state(ob);
    train_with(a, oa, 0, 2, ctx.rank, ctx.world_size);
    train_with(b, ob, 0, 2, ctx.rank, ctx.world_size);
    expect_equal_values(full_values(*b.module), full_values(*a.module), "init_optimizer_state is neutral for Adam");
  });
}

// Resume across world sizes: Adam trains 3 steps at N ranks, rank 0 saves the FULL model and
// optimizer state dicts with torch::save, a fresh model on a fresh group of M ranks loads them
// and trains 3 more steps; parameters match uninterrupted single-process training (float32
// tolerance as above: the ranks sum gradients in another order).
int resume_world_size(int n) { return n == 1 ? 2 : n == 2 ? 3 : n == 3 ? 1 : 2; }

TEST_P(FSDPStateDict, OptimizerStateDictResumeAcrossWorldSizes) {
  const int n = GetParam(), m = resume_world_size(n);
  run_ranks(std::max(n, m), [n, m](RankContext& ctx) {
    std::vector<int> first_n, first_m;
    for (int r = 0; r < n; ++r) first_n.push_back(r);
    for (int r = 0; r < m; ++r) first_m.push_back(r);
    ProcessGroup group_n = ctx.world.new_group(first_n);
    ProcessGroup group_m = ctx.world.new_group(first_m);
    const std::string model_path = ctx.temp_dir + "/model.pt", optim_path = ctx.temp_dir + "/optim.pt";
    if (ctx.rank < n) {
      Net net = make_net(Wrap::kNested, FullyShardOptions().process_group(group_n));
      torch::optim::Adam opt(net.module->parameters(), adam_options());
      train_with(net, opt, 0, 3, ctx.rank, n);
      StateDict sd = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true).cpu_offload(true));
      OptimizerStateDict osd = get_optimizer_state_dict(*net.module, opt, StateDictOptions().full_state_dict(true).cpu_offload(true));
      if (ctx.rank == 0) {
        torch::save(sd, model_path);
        torch::save(osd, optim_path);
      } else {
        EXPECT_TRUE(osd.rank0_only_placeholder);
      }
    }
    barrier(ctx.world);
    if (ctx.rank < m) {
      Net net = make_net(Wrap::kNested, FullyShardOptions().process_group(group_m));
      zero_model(*net.module);
      torch::optim::Adam opt(net.module->parameters(), torch::optim::AdamOptions(0.5));
      StateDict sd;
      OptimizerStateDict osd;
      torch::load(sd, model_path);
      torch::load(osd, optim_path);
      set_model_state_dict(*net.module, sd);
      set_optimizer_state_dict(*net.module, opt, osd);
      train_with(net, opt, 3, 3, ctx.rank, m);
      Net ref = make_net(Wrap::kNone);
      torch::optim::Adam ref_opt(ref.module->parameters(), adam_options());
      train_with(ref, ref_opt, 0, 6, 0, 1);
      StateDict full = get_model_state_dict(*net.module, StateDictOptions().full_state_dict(true));
      expect_full_sd_equals_plain(full, *ref.module, std::to_string(n) + " -> " + std::to_string(m) + " ranks");
    }
    barrier(ctx.world);
  });
}

// Bad optimizer state dicts: named errors, the optimizer unchanged.
TEST_P(FSDPStateDict, OptimizerStateDictErrors) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    Net net = make_net(Wrap::kNested);
    torch::optim::Adam opt(net.module->parameters(), adam_options());
    train_with(net, opt, 0, 1, ctx.rank, ctx.world_size);
    OptimizerStateDict good = get_optimizer_state_dict(*net.module, opt, StateDictOptions().full_state_dict(true));
    auto state_of = [&] { return get_optimizer_state_dict(*net.module, opt, StateDictOptions().full_state_dict(true)); };
    {
      OptimizerStateDict bad = good;
      bad.state.at("3.weight").set("exp_avg", torch::zeros({2, 2}));
      const std::string e = error_of([&] { set_optimizer_state_dict(*net.module, opt, bad); });
      EXPECT_NE(e.find("'3.weight' entry 'exp_avg'"), std::string::npos) << e;
      EXPECT_NE(e.find("[2, 2]"), std::string::npos) << e;
      EXPECT_NE(e.find("[15, 15]"), std::string::npos) << e;
    }
    {
      OptimizerStateDict bad = good;
      bad.param_groups[0].params.push_back("9.weight");
      const std::string e = error_of([&] { set_optimizer_state_dict(*net.module, opt, bad); });
      EXPECT_NE(e.find("unexpected '9.weight'"), std::string::npos) << e;
    }
    {
      OptimizerStateDict bad = good;
      bad.state.at("0.bias").set("momentum", torch::zeros({15}));
      const std::string e = error_of([&] { set_optimizer_state_dict(*net.module, opt, bad); });
      EXPECT_NE(e.find("'0.bias' has state entry 'momentum'"), std::string::npos) << e;
    }
    torch::optim::SGD sgd(net.module->parameters(), 0.1);
    EXPECT_NE(error_of([&] { set_optimizer_state_dict(*net.module, sgd, good); }).find("holds torch::optim::AdamOptions"),
              std::string::npos);
    OptimizerStateDict after = state_of();
    for (const auto& [key, entries] : good.state)
      for (const auto& [name, value] : entries)
        EXPECT_TRUE(at::equal(after.state.at(key).at(name).tensor(), value.tensor())) << key << " " << name;
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FSDPStateDict);

// ---- ShardedTensor ----------------------------------------------------------------------------

class ShardedTensorChecks : public testing::WorldSizeTest {};

// from_local_shards with N-d offsets and several shards per rank; full_tensor() reassembles;
// inconsistent layouts are refused on every rank with the culprit named.
TEST_P(ShardedTensorChecks, FromLocalShardsAndFullTensor) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, r = ctx.rank;
    // A (2n) x 4 tensor: rank r holds rows [2r, 2r + 2) as two column blocks of 1 and 3.
    at::Tensor full = torch::arange(2 * n * 4).to(at::kFloat).view({2 * n, 4});
    std::vector<Shard> shards{Shard::from_tensor_and_offsets(full.narrow(0, 2 * r, 2).narrow(1, 0, 1).clone(), {2 * r, 0}, r),
                              Shard::from_tensor_and_offsets(full.narrow(0, 2 * r, 2).narrow(1, 1, 3).clone(), {2 * r, 1}, r)};
    ShardedTensor st = ShardedTensor::from_local_shards(shards, {2 * n, 4});
    EXPECT_EQ(st.shards_metadata().size(), static_cast<size_t>(2 * n));
    EXPECT_EQ(st.dtype(), at::kFloat);
    EXPECT_TRUE(at::equal(st.full_tensor(), full));

    // A rank without shards: rank 0 holds everything.
    std::vector<Shard> all_on_0;
    if (r == 0) all_on_0.push_back(Shard::from_tensor_and_offsets(full.clone(), {0, 0}, 0));
    EXPECT_TRUE(at::equal(ShardedTensor::from_local_shards(all_on_0, {2 * n, 4}).full_tensor(), full));

    // A gap: the global size has one more row than the shards cover.
    EXPECT_NE(error_of([&] { ShardedTensor::from_local_shards(shards, {2 * n + 1, 4}); }).find("cover"), std::string::npos);
    // Outside the global size.
    EXPECT_NE(error_of([&] { ShardedTensor::from_local_shards(shards, {2 * n, 3}); }).find("lies outside"), std::string::npos);
    // Ranks disagreeing on the global size (rank 0 says 2n + 2 rows).
    if (n > 1) {
      const std::vector<int64_t> size = r == 0 ? std::vector<int64_t>{2 * n + 2, 4} : std::vector<int64_t>{2 * n, 4};
      EXPECT_NE(error_of([&] { ShardedTensor::from_local_shards(shards, size); }).find("gives global size"), std::string::npos);
      // Overlap: every rank claims rows [0, 2).
      std::vector<Shard> same{Shard::from_tensor_and_offsets(full.narrow(0, 0, 2).clone(), {0, 0}, r)};
      EXPECT_NE(error_of([&] { ShardedTensor::from_local_shards(same, {2 * n, 4}); }).find("overlaps"), std::string::npos);
    }
    // A tensor of another shape than its metadata: its rank names it, the others name that rank.
    std::vector<Shard> bad = shards;
    if (r == 0) bad[0].metadata.shard_sizes = {2, 2};
    const std::string e = error_of([&] { ShardedTensor::from_local_shards(bad, {2 * n, 4}); });
    EXPECT_NE(e.find(r == 0 ? "holds a tensor of shape [2, 1]" : "rank 0's local shards are invalid"), std::string::npos) << e;
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(ShardedTensorChecks);

// Seed 000 test_local_state_dict_reshard (4 GPUs): a LOCAL state dict of 4 ranks, all-gathered
// and re-split in two chunks, loads into the same model sharded over 2 ranks. The LOCAL flat
// parameter's global value is the unit's parameters concatenated (independent of the world
// size), so a differently sharded one is redistributed on load.
TEST(FSDPStateDict4Ranks, LocalStateDictReshard) {
  run_ranks(4, [](RankContext& ctx) {
    Net model = make_net(Wrap::kNested);
    train(model, 1, ctx.rank, 4);
    StateDict sd;
    {
      auto scope = state_dict_type(*model.module, StateDictType::LOCAL_STATE_DICT);
      sd = state_dict(*model.module);
    }
    ProcessGroup new_pg = ctx.world.new_group({0, 1});
    StateDict resharded;
    for (const auto& [key, value] : sd) {
      if (value.is_sharded()) {
        at::Tensor full_flat = value.sharded_tensor().full_tensor();  // every rank of the 4
        if (ctx.rank < 2) {
          auto chunks = full_flat.chunk(2);
          const int64_t offset = ctx.rank == 0 ? 0 : chunks[0].numel();
          resharded.insert(key, ShardedTensor::from_local_shards(
                                    {Shard::from_tensor_and_offsets(chunks[ctx.rank].clone(), {offset}, ctx.rank)},
                                    {full_flat.numel()}, new_pg));
        }
      } else if (ctx.rank < 2) {
        resharded.insert(key, value);
      }
    }
    StateDict full1 = get_model_state_dict(*model.module, StateDictOptions().full_state_dict(true));
    if (ctx.rank < 2) {
      Net model2 = make_net(Wrap::kNested, FullyShardOptions().process_group(new_pg));
      zero_model(*model2.module);
      {
        auto scope = state_dict_type(*model2.module, StateDictType::LOCAL_STATE_DICT);
        load_state_dict(*model2.module, resharded);
      }
      StateDict full2 = get_model_state_dict(*model2.module, StateDictOptions().full_state_dict(true));
      ASSERT_EQ(full2.keys(), full1.keys());
      for (const auto& [key, value] : full1) EXPECT_TRUE(at::equal(full2.at(key).tensor(), value.tensor())) << key;
    }
    barrier(ctx.world);
  });
}

}  // namespace
}  // namespace fsdpp

// Ignored parameters and modules (FSDP2's ignored_params, FSDP1's ignored_modules): they stay
// whole and un-synchronized, state dicts hold them under their plain names (seed 000's
// test_state_dict_with_ignored_modules, seed 002's test_state_dict_save_load_flow with
// ignore_modules), auto-wrap makes no unit of them, and misuse is refused.
#include <map>
#include <optional>

#include <fsdpp/error.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "transformer.h"

namespace fsdpp {
namespace {

// Seed 000's Model: inner = Linear(4, 4) run twice, outer = Linear(4, 5), each with a buffer;
// the inner Linear may be a unit of its own (ignoring itself: a unit that shards nothing). The
// inner Linear also holds a float16 buffer (the seed's float16 buffer case, below).
struct SeedModelImpl : torch::nn::Module {
  SeedModelImpl(bool wrap_inner, bool ignore_inner, FullyShardOptions options) {
    Linear inner_linear(4, 4);
    inner_linear->register_buffer("buffer", torch::randn({5, 5}));
    inner_linear->register_buffer("half_buffer", torch::randn({3}).to(at::kHalf));
    if (wrap_inner) {
      if (ignore_inner) options.ignored_modules({inner_linear.ptr()});
      inner_unit = register_module("inner", FSDPLinear(inner_linear, options));
    } else {
      inner = register_module("inner", inner_linear);
    }
    outer = register_module("outer", Linear(4, 5));
    outer->register_buffer("buffer", torch::randn({5, 5}));
  }
  at::Tensor run_inner(const at::Tensor& x) { return inner_unit ? inner_unit(x) : inner(x); }
  at::Tensor forward(at::Tensor x) { return outer(run_inner(x) + run_inner(x)); }

  Linear inner{nullptr}, outer{nullptr};
  FSDPLinear inner_unit{nullptr};
};
TORCH_MODULE(SeedModel);

// A state dict with every ShardedTensor replaced by its full value (PyTorch's _gather_state_dict).
StateDict gathered(const StateDict& sd) {
  StateDict out;
  for (const auto& [key, value] : sd)
    out.insert(key, value.is_sharded() ? value.sharded_tensor().full_tensor() : value.tensor());
  return out;
}

class FullyShardIgnored : public testing::WorldSizeTest {};

// Every parameter and buffer of `model` under its plain name (without wrapper segments).
std::map<std::string, at::Tensor> plain_named_tensors(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model.named_parameters()) out[strip_wrapper_prefixes(p.key())] = p.value();
  for (const auto& b : model.named_buffers()) out[strip_wrapper_prefixes(b.key())] = b.value();
  return out;
}

// Seed 000's test_state_dict_with_ignored_modules (its body in PyTorch): the outer Linear ignored
// by the root, the inner one ignoring itself or not, float16 mixed precision (the seed's
// param_dtype and reduce_dtype) or none, FULL or SHARDED. The model first trains a step and runs
// an evaluation forward, then the inner unit is gathered (unshard(): in float16 under mixed
// precision) while the dicts are taken. The ignored parameters and every buffer are in
// the dict with the module's values, as copies (fsdpp's documented choice, docs/api.md: every
// whole entry is a copy, where the seed checks that PyTorch's are the module's own tensors), a
// second dict copying again; buffers keep their dtype (float32, and the float16 buffer float16: FSDP2's policy has no
// buffer_dtype, so nothing casts a buffer and the seed's exemption of the cast fp16 inner buffer
// does not arise); the non-ignored parameters are float32 (the sharded values, not the float16
// compute copies); and the plain model, zeroed, loads it strictly and then holds
// summon_full_params' values.
TEST_P(FullyShardIgnored, test_state_dict_with_ignored_modules) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    for (bool ignore_inner : {false, true})
      for (bool mixed_precision : {false, true})
        for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT}) {
          const std::string where = std::string("ignore_inner ") + (ignore_inner ? "T" : "F") + ", mixed precision " +
                                    (mixed_precision ? "T, " : "F, ") + to_string(type);
          FullyShardOptions options;
          // The ignored float32 outer takes the inner unit's output in float32; an ignored inner
          // Linear (float32) takes the input uncast.
          if (mixed_precision)
            options.mp_policy(MixedPrecisionPolicy()
                                  .param_dtype(at::kHalf)
                                  .reduce_dtype(at::kHalf)
                                  .output_dtype(at::kFloat)
                                  .cast_forward_inputs(!ignore_inner));
          torch::manual_seed(0);
          SeedModel plain(false, false, FullyShardOptions());
          torch::manual_seed(0);
          SeedModel model(true, ignore_inner, options);
          FullyShardedDataParallel<SeedModelImpl> fsdp(model,
                                                       FullyShardOptions(options).ignored_modules({model->outer.ptr()}));

          // Ignored parameters stay whole; the others are shards.
          auto inner_weight = model->inner_unit->module()->weight;
          EXPECT_TRUE(at::equal(model->outer->weight, plain->outer->weight)) << where;
          EXPECT_TRUE(at::equal(inner_weight, ignore_inner ? plain->inner->weight : shard_rows(plain->inner->weight, rank, n)))
              << where;

          // A training step on this rank's slice, an evaluation forward, then the inner unit gathered.
          const int64_t local = kGlobalBatch / n;
          torch::manual_seed(99);
          at::Tensor x = torch::randn({kGlobalBatch, 4}).narrow(0, rank * local, local);
          torch::optim::SGD opt(fsdp->parameters(), 0.1);
          fsdp->forward(x).pow(2).sum().backward();
          plain->forward(x).pow(2).sum().backward();
          if (!mixed_precision) {
            // Ignored parameters are not synchronized: their gradient is this rank's own, bitwise
            // what the plain model computes on this rank's slice.
            EXPECT_TRUE(at::equal(model->outer->weight.grad(), plain->outer->weight.grad())) << where;
            EXPECT_TRUE(at::equal(model->outer->bias.grad(), plain->outer->bias.grad())) << where;
            if (ignore_inner) {
              EXPECT_TRUE(at::equal(inner_weight.grad(), plain->inner->weight.grad())) << where;
            }
          }
          opt.step();
          {
            torch::NoGradGuard no_grad;
            fsdp->forward(x);
          }
          model->inner_unit->unshard();
          if (mixed_precision && !ignore_inner) {
            ASSERT_EQ(model->inner_unit->module()->weight.scalar_type(), at::kHalf)
                << where << ": the inner unit is gathered in float16 when the dict is taken";
          }

          auto scope = state_dict_type(*fsdp, type);
          StateDict sd = state_dict(*fsdp);
          StateDict plain_sd = state_dict(*plain);
          ASSERT_EQ(sd.keys(), plain_sd.keys()) << where;
          const auto tensors = plain_named_tensors(*fsdp);
          auto is_ignored = [&](const std::string& key) {
            return key.rfind("outer.", 0) == 0 || (ignore_inner && key.rfind("inner.", 0) == 0);
          };
          for (const auto& [key, value] : sd) {
            const bool buffer = key.find("buffer") != std::string::npos;
            EXPECT_EQ(value.dtype(), key == "inner.half_buffer" ? at::kHalf : at::kFloat) << where << " " << key;
            if (is_ignored(key) || buffer) {
              ASSERT_TRUE(value.is_tensor()) << where << " " << key << ": ignored entries and buffers are whole";
              EXPECT_TRUE(at::equal(value.tensor(), tensors.at(key))) << where << " " << key;
              EXPECT_NE(value.tensor().data_ptr(), tensors.at(key).data_ptr())
                  << where << " " << key << ": the module's own tensor, not a copy";
            } else if (type == StateDictType::FULL_STATE_DICT) {
              EXPECT_TRUE(value.is_tensor()) << where << " " << key;
            } else {
              EXPECT_TRUE(value.is_sharded()) << where << " " << key;
            }
          }
          // A second dict copies again.
          StateDict again = state_dict(*fsdp);
          for (const auto& [key, value] : sd) {
            if (is_ignored(key) || key.find("buffer") != std::string::npos) {
              EXPECT_NE(again.at(key).tensor().data_ptr(), value.tensor().data_ptr()) << where << " " << key;
            }
          }
          // Summoned while the inner unit is still gathered in float16: float32 values all the same.
          std::vector<at::Tensor> fsdp_params = full_params(*fsdp);
          model->inner_unit->reshard();
          // A plain model, zeroed, loads it strictly (seed: the non-wrapped model).
          StateDict full = gathered(sd);
          torch::manual_seed(5);
          SeedModel fresh(false, false, FullyShardOptions());
          {
            torch::NoGradGuard no_grad;
            for (auto& p : fresh->parameters()) p.zero_();
          }
          load_state_dict(*fresh, full);
          auto fresh_params = fresh->parameters();
          ASSERT_EQ(fresh_params.size(), fsdp_params.size()) << where;
          for (size_t i = 0; i < fsdp_params.size(); ++i)
            EXPECT_TRUE(at::equal(fresh_params[i], fsdp_params[i])) << where << " param " << i;
          for (const auto& b : fresh->named_buffers())
            EXPECT_TRUE(at::equal(b.value(), tensors.at(b.key()))) << where << " " << b.key();
          if (::testing::Test::HasFailure()) return;
        }
  });
}

// Found porting the seed above (its summon_full_params follows the dict): summon_full_params
// promises the parameters in their own dtype (float32 under a float16 policy, as FSDP1's), also
// for a unit already gathered for compute (here by unshard()), which it used to leave as it was
// (float16 compute copies). The unit is gathered for compute again afterwards, and an edit made
// under the guard reaches the shards.
TEST(FullyShardSummonFullParamsMixedPrecision, GatheredUnitGivesFloat32) {
  run_ranks(2, [](RankContext&) {
    torch::manual_seed(0);
    FSDPLinear unit(Linear(4, 4), FullyShardOptions().mp_policy(MixedPrecisionPolicy().param_dtype(at::kHalf)));
    const auto expected = full_params(*unit);  // resharded: float32
    unit->unshard();
    ASSERT_EQ(unit->module()->weight.scalar_type(), at::kHalf) << "gathered in float16 for compute";
    const auto summoned = full_params(*unit);
    ASSERT_EQ(summoned.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(summoned[i].scalar_type(), at::kFloat) << "param " << i;
      EXPECT_TRUE(at::equal(summoned[i].to(at::kFloat), expected[i])) << "param " << i;
    }
    EXPECT_EQ(unit->module()->weight.scalar_type(), at::kHalf) << "gathered for compute again after the guard";
    EXPECT_EQ(unit->module()->weight.sizes(), (std::vector<int64_t>{4, 4})) << "unsharded after the guard";
    {
      auto full = summon_full_params(*unit);
      unit->module()->weight.detach().fill_(0.25);  // float32, written back to the shards
    }
    unit->reshard();
    const auto edited = full_params(*unit);
    EXPECT_TRUE(at::equal(edited[0], at::full({4, 4}, 0.25))) << "the edit reached the shards";
    unit->reshard();
  });
}

// Seed 002's test_state_dict_save_load_flow with ignore_modules T/F and FULL / SHARDED: the
// transformer (output tied to the token embedding, as TransformerWithSharedParams) wrapped by
// block (ModuleWrapPolicy) with its position embedding and final norm ignored saves a dict equal
// to the plain model's, and a zeroed model wrapped the same way loads it back to the saved
// model's values. Also rank0_only + CPU offload, named in the seed's docstring: FULL with
// rank0_only and offload_to_cpu (rank 0 holds the whole dict on the CPU, the other ranks the
// empty placeholder; loaded by set_model_state_dict's broadcast_from_rank0), SHARDED with
// offload_to_cpu (each rank's shards on the CPU).
TEST_P(FullyShardIgnored, test_state_dict_save_load_flow) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    using examples::Transformer;
    using examples::TransformerBlockImpl;
    examples::TransformerArgs args;
    args.weight_tying = true;  // the seed's TransformerWithSharedParams: output tied to the embedding
    auto wrap = [&](Transformer model, bool ignore) {
      auto options = FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>());
      if (ignore) options.ignored_modules({model->pos_embeddings.ptr(), model->norm.ptr()});
      return fully_shard(model, options);
    };
    for (bool ignore : {false, true})
      for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT})
        for (bool rank0_only_and_offload : {false, true}) {
          const bool rank0_only = rank0_only_and_offload && type == StateDictType::FULL_STATE_DICT;
          const std::string where = std::string("ignore_modules ") + (ignore ? "T, " : "F, ") + to_string(type) +
                                    (rank0_only_and_offload ? (rank0_only ? ", rank0_only + offload" : ", offload") : "");
          std::optional<StateDictConfig> config;
          if (rank0_only_and_offload)
            config = type == StateDictType::FULL_STATE_DICT
                         ? StateDictConfig(FullStateDictConfig().rank0_only(true).offload_to_cpu(true))
                         : StateDictConfig(ShardedStateDictConfig().offload_to_cpu(true));
          // As the seed: no parameter all zeros (the norms' biases), so the zeroed destination
          // differs from the saved model in every parameter before the load.
          auto nonzero = [](Transformer m) {
            torch::NoGradGuard no_grad;
            for (auto& p : m->parameters())
              if (p.count_nonzero().item<int64_t>() == 0) p.add_(torch::ones_like(p));
            return m;
          };
          torch::manual_seed(0);
          Transformer plain = nonzero(Transformer(args));
          torch::manual_seed(0);
          Transformer saved_plain = nonzero(Transformer(args));
          auto saved = wrap(saved_plain, ignore);
          EXPECT_EQ(saved_plain->pos_embeddings->weight.sizes() == plain->pos_embeddings->weight.sizes(),
                    ignore || ctx.world_size == 1)
              << where << ": an ignored embedding stays whole, a sharded one is not";
          StateDict sd;
          {
            auto scope = state_dict_type(*saved, type, config);
            sd = state_dict(*saved);
          }
          StateDict expected = state_dict(*plain);
          if (rank0_only && ctx.rank != 0) {
            EXPECT_TRUE(sd.empty()) << where << ": rank " << ctx.rank;
            EXPECT_TRUE(sd.rank0_only_placeholder) << where;
          } else {
            StateDict full = gathered(sd);
            ASSERT_EQ(full.keys(), expected.keys()) << where;
            for (const auto& key : expected.keys()) {
              EXPECT_TRUE(at::equal(full.at(key).tensor(), expected.at(key).tensor())) << where << " " << key;
              if (!rank0_only_and_offload) continue;
              if (sd.at(key).is_sharded()) {
                for (const auto& shard : sd.at(key).sharded_tensor().local_shards())
                  EXPECT_TRUE(shard.tensor.device().is_cpu()) << where << " " << key;
              } else {
                EXPECT_TRUE(sd.at(key).tensor().device().is_cpu()) << where << " " << key;
              }
            }
          }

          torch::manual_seed(1);
          Transformer load_plain(args);
          {
            torch::NoGradGuard no_grad;
            for (auto& p : load_plain->parameters()) p.zero_();
          }
          auto loaded = wrap(load_plain, ignore);
          {
            auto before = full_params(*loaded), want = full_params(*saved);
            for (size_t i = 0; i < before.size(); ++i)
              EXPECT_FALSE(at::equal(before[i], want[i])) << where << " param " << i << " equal before the load";
          }
          if (rank0_only) {
            auto result = set_model_state_dict(*loaded, sd, StateDictOptions().full_state_dict(true).broadcast_from_rank0(true));
            EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty()) << where;
          } else {
            auto load_scope = state_dict_type(*loaded, type);
            auto result = load_state_dict(*loaded, sd);
            EXPECT_TRUE(result.missing_keys.empty() && result.unexpected_keys.empty()) << where;
          }
          auto a = full_params(*loaded), b = full_params(*saved);
          ASSERT_EQ(a.size(), b.size());
          for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << where << " param " << i;
          EXPECT_TRUE(load_plain->output->weight.is_same(load_plain->tok_embeddings->weight)) << where << ": tie kept";
          if (::testing::Test::HasFailure()) return;
        }
  });
}

// FSDP2's ignored_params on one parameter; an auto-wrap policy makes no unit of an ignored module.
TEST_P(FullyShardIgnored, IgnoredParamsAndAutoWrap) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    torch::manual_seed(0);
    Sequential plain = make_mlp({{6, 8}, {8, 3}});
    torch::manual_seed(0);
    Sequential net = make_mlp({{6, 8}, {8, 3}});
    auto first = net[0]->as<torch::nn::Linear>();
    FSDPSequential model(net, FullyShardOptions().ignored_params({first->bias}));
    EXPECT_TRUE(at::equal(first->bias, plain[0]->as<torch::nn::Linear>()->bias)) << "ignored: whole";
    EXPECT_TRUE(at::equal(first->weight, shard_rows(plain[0]->as<torch::nn::Linear>()->weight, rank, n)));
    EXPECT_EQ(model->sharded_parameter_names(), (std::vector<std::string>{"0.weight", "2.weight", "2.bias"}));

    torch::manual_seed(0);
    Sequential net2 = make_mlp({{6, 8}, {8, 3}});
    FSDPSequential model2(net2, FullyShardOptions().auto_wrap_policy(SizeBasedAutoWrapPolicy(1)).ignored_modules({net2[2]}));
    EXPECT_EQ(fsdp_units(*model2).size(), 2u) << "the root and Linear 0; not the ignored Linear 2";
    EXPECT_TRUE(at::equal(net2[2]->as<torch::nn::Linear>()->weight, plain[2]->as<torch::nn::Linear>()->weight));
  });
}

// Ignored parameters or modules that are not the module's: an error naming the entry, and the
// module untouched (its parameters whole, wrappable afterwards).
TEST(FullyShardIgnoredErrors, NotTheModulesIsRefused) {
  run_ranks(1, [](RankContext&) {
    Linear lin(4, 3), other(2, 2);
    const at::Tensor before = lin->weight.detach().clone();
    auto message = [&](const FullyShardOptions& o) {
      try {
        FSDPLinear unit(lin, o);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string param_error = message(FullyShardOptions().ignored_params({lin->bias, other->weight}));
    EXPECT_NE(param_error.find("ignored_params[1] (shape [2, 2]) is not a parameter of the module"), std::string::npos)
        << param_error;
    const std::string module_error = message(FullyShardOptions().ignored_modules({other.ptr()}));
    EXPECT_NE(module_error.find("ignored_modules[0] (" + other->name() + ") is not the module or one of its submodules"),
              std::string::npos)
        << module_error;
    EXPECT_TRUE(at::equal(lin->weight, before));
    FSDPLinear ok(lin, FullyShardOptions().ignored_params({lin->bias}));
    EXPECT_EQ(ok->sharded_parameter_names(), std::vector<std::string>{"weight"});
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardIgnored);

}  // namespace
}  // namespace fsdpp

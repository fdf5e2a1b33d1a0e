// FSDP2's MixedPrecisionPolicy (test_fully_shard_mixed_precision.py's approach): parity with a
// single-process reference that does the same casts (parameters cast to the compute dtype for
// forward and backward, each rank's gradient reduced in reduce_dtype, a float32 optimizer step),
// the bytes on the wire, the dtypes at every stage, nesting, state dicts and misuse.
#include <iostream>
#include <optional>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>
#include <fsdpp/state_dict.h>

#include "dist/fsdp_test_util.h"

namespace fsdpp {
namespace {

using Dtype = std::optional<at::ScalarType>;

MixedPrecisionPolicy policy(Dtype param, Dtype reduce = std::nullopt, Dtype output = std::nullopt) {
  MixedPrecisionPolicy p;
  p.param_dtype(param);
  p.reduce_dtype(reduce);
  p.output_dtype(output);
  return p;
}

const char* name_of(Dtype d) { return d ? c10::toString(*d) : "unset"; }

std::string describe(const MixedPrecisionPolicy& p) {
  return std::string("param ") + name_of(p.param_dtype()) + " reduce " + name_of(p.reduce_dtype()) + " output " +
         name_of(p.output_dtype());
}

at::Tensor cast(const at::Tensor& t, Dtype d) { return d && t.scalar_type() != *d ? t.to(*d) : t; }

// libtorch 1.13's CPU kernels have no float16 matmul ("addmm_impl_cpu_" not implemented for
// 'Half'); 2.x's do.
bool cpu_has_half_matmul() {
  try {
    at::mm(at::ones({2, 2}, at::kHalf), at::ones({2, 2}, at::kHalf));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// make_multi_group's model: Linear(7, 15) and Linear(15, 15) as inner units with their own
// policies, Linear(15, 3) in the root.
struct Policies {
  MixedPrecisionPolicy root, first, second;
};

FSDPSequential make_model(const Policies& p) {
  Linear l1(7, 15), l2(15, 15), l3(15, 3);
  auto opts = [](const MixedPrecisionPolicy& mp) { return FullyShardOptions().mp_policy(mp); };
  return FSDPSequential(Sequential(FSDPLinear(l1, opts(p.first)), ReLU(), FSDPLinear(l2, opts(p.second)), ReLU(), l3),
                        opts(p.root));
}

// The reference: float32 master parameters (the optimizer's) and a compute copy cast per unit,
// run on every rank's slice in turn with the casts the units make; each parameter's gradient is
// the reduce-dtype mean of the slices' gradients, reduced as fsdpp reduces in that dtype
// (float32 sum of the ranks in order, divided, rounded once; float32 by ring, equal up to order).
class Reference {
 public:
  explicit Reference(const Policies& p) : policies_(p) {
    torch::manual_seed(0);
    master_ = make_multi_group(false, {});
    compute_ = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(master_->clone());
    layer_policy_ = {&p.first, &p.second, &p.root};
    for (size_t i = 0; i < 3; ++i) compute_[2 * i]->to(dtype_of(i));
  }

  Sequential& master() { return master_; }

  // Returns each slice's loss (rank-major, then microbatch); leaves the master gradients set.
  // With microbatches, each rank's gradients are summed in the reduce dtype first, as a unit
  // without gradient sync accumulates them.
  std::vector<at::Tensor> step_gradients(const at::Tensor& x, const at::Tensor& y, int n, int micro = 1) {
    at::NoGradGuard outer;
    {
      auto m = master_->parameters();
      auto c = compute_->parameters();
      for (size_t i = 0; i < m.size(); ++i) c[i].copy_(m[i]);
    }
    const int64_t rows = x.size(0) / n / micro;
    std::vector<std::vector<at::Tensor>> grads(n);
    std::vector<at::Tensor> losses;
    for (int r = 0; r < n; ++r)
      for (int mb = 0; mb < micro; ++mb) {
        torch::AutoGradMode grad_on(true);
        for (auto& p : compute_->parameters()) p.mutable_grad().reset();
        const int64_t first = (r * micro + mb) * rows;
        at::Tensor loss = (forward(x.narrow(0, first, rows)) - y.narrow(0, first, rows)).pow(2).mean();
        loss.backward();
        losses.push_back(loss.detach());
        auto params = compute_->parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          if (mb == 0)
            grads[r].push_back(params[i].grad().to(reduce_dtype_of(i / 2)));
          else
            grads[r][i].add_(params[i].grad());
        }
      }
    auto m = master_->parameters();
    for (size_t i = 0; i < m.size(); ++i) {
      std::vector<at::Tensor> per_rank;
      for (int r = 0; r < n; ++r) per_rank.push_back(grads[r][i]);
      const at::ScalarType reduce = reduce_dtype_of(i / 2);
      const at::Tensor stacked = at::stack(per_rank).to(reduce);
      at::Tensor mean;
      if (n == 1)
        mean = stacked[0];
      else if (reduce == at::kBFloat16 || reduce == at::kHalf)
        mean = stacked.to(at::kFloat).sum(0).div_(n).to(reduce);
      else
        mean = stacked.sum(0).div_(n);
      m[i].mutable_grad() = mean.to(at::kFloat);
    }
    return losses;
  }

 private:
  at::ScalarType dtype_of(size_t layer) const { return layer_policy_[layer]->param_dtype().value_or(at::kFloat); }
  at::ScalarType reduce_dtype_of(size_t layer) const {
    return layer_policy_[layer]->reduce_dtype().value_or(dtype_of(layer));
  }
  at::Tensor unit(size_t layer, const at::Tensor& x) {
    const MixedPrecisionPolicy& p = *layer_policy_[layer];
    at::Tensor out = compute_[2 * layer]->as<torch::nn::Linear>()->forward(cast(x, p.param_dtype()));
    return cast(out, p.output_dtype());
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = cast(x, policies_.root.param_dtype());
    h = torch::relu(unit(0, h));
    h = torch::relu(unit(1, h));
    h = compute_[4]->as<torch::nn::Linear>()->forward(h);
    return cast(h, policies_.root.output_dtype());
  }

  Policies policies_;
  Sequential master_;
  Sequential compute_;
  std::vector<const MixedPrecisionPolicy*> layer_policy_;
};

// Trains the model and the reference for `steps` Adam steps; at world sizes 1 and 2 every
// number must match bitwise (same casts, same kernels, a two-term sum), at 3 and 4 the float32
// reduction order differs: gradients within float32 tolerance, losses within bfloat16's.
void check_parity(RankContext& ctx, const Policies& policies, const std::string& label, int micro = 1, int steps = 6) {
  const int n = ctx.world_size, rank = ctx.rank;
  Reference ref(policies);
  torch::manual_seed(0);
  FSDPSequential model = make_model(policies);
  auto ref_params = ref.master()->parameters();
  auto params = model->parameters();
  torch::optim::Adam ref_opt(ref_params, torch::optim::AdamOptions(1e-2));
  torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-2));
  const int64_t local = kGlobalBatch / n;
  const bool exact = n <= 2;
  for (int step = 0; step < steps; ++step) {
    const std::string where = label + " step " + std::to_string(step);
    torch::manual_seed(1000 + step);
    at::Tensor x = torch::randn({kGlobalBatch, 7});
    at::Tensor y = torch::randn({kGlobalBatch, 3});
    auto ref_losses = ref.step_gradients(x, y, n, micro);
    opt.zero_grad();
    const int64_t rows = local / micro;
    for (int mb = 0; mb < micro; ++mb) {
      model->set_requires_gradient_sync(mb == micro - 1);
      const int64_t first = rank * local + mb * rows;
      at::Tensor out = model->forward(x.narrow(0, first, rows));
      ASSERT_EQ(out.scalar_type(), policies.root.output_dtype().value_or(policies.root.param_dtype().value_or(at::kFloat)))
          << where;
      at::Tensor loss = (out - y.narrow(0, first, rows)).pow(2).mean();
      loss.backward();
      const at::Tensor& expected = ref_losses[rank * micro + mb];
      if (exact) {
        EXPECT_TRUE(at::equal(loss.detach(), expected)) << where << " loss " << loss.item<double>() << " vs "
                                                        << expected.item<double>();
      } else {
        EXPECT_TRUE(at::allclose(loss.detach().to(at::kFloat), expected.to(at::kFloat), 1.6e-2, 1e-5))
            << where << " loss " << loss.item<double>() << " vs " << expected.item<double>();
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      ASSERT_EQ(params[i].scalar_type(), at::kFloat) << where << " sharded param " << i;
      ASSERT_EQ(params[i].grad().scalar_type(), at::kFloat) << where << " grad " << i;
      const at::Tensor expected = shard_rows(ref_params[i].grad(), rank, n);
      if (exact)
        EXPECT_TRUE(at::equal(params[i].grad(), expected)) << where << " grad " << i << " max diff "
                                                           << (params[i].grad() - expected).abs().max().item<double>();
      else
        expect_close(params[i].grad(), expected, where + " grad " + std::to_string(i));
    }
    ref_opt.step();
    opt.step();
    auto full = full_params(*model);
    for (size_t i = 0; i < full.size(); ++i) {
      ASSERT_EQ(full[i].scalar_type(), at::kFloat) << where;
      if (exact)
        EXPECT_TRUE(at::equal(full[i], ref_params[i].detach())) << where << " param " << i;
      else
        expect_close(full[i], ref_params[i].detach(), where + " param " + std::to_string(i));
    }
    if (::testing::Test::HasFailure()) return;
  }
}

class FullyShardMixedPrecision : public testing::WorldSizeTest {};

// FSDP2's test_train_parity_mixed_precision cases: bf16 compute with float32 and bf16
// reduction, float16, a reduce_dtype alone, and output_dtype on the root.
TEST_P(FullyShardMixedPrecision, test_reduce_dtype_train_parity) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto bf16 = at::kBFloat16, f16 = at::kHalf, f32 = at::kFloat;
    struct Case {
      const char* name;
      MixedPrecisionPolicy mp;
      Dtype root_output;  // the inner units hand on what they computed
    };
    for (const Case& c : {Case{"bf16 compute, fp32 reduce", policy(bf16, f32), f32},
                          Case{"bf16 compute and reduce", policy(bf16), f32},
                          Case{"fp16 compute and reduce, fp16 output", policy(f16), std::nullopt},
                          Case{"bf16 compute, fp16 reduce", policy(bf16, f16), f32},
                          Case{"fp32 compute, bf16 reduce", policy(std::nullopt, bf16), std::nullopt}}) {
      if (c.mp.param_dtype() == f16 && !cpu_has_half_matmul()) {
        if (ctx.rank == 0) std::cerr << "not run here: " << c.name << " (this libtorch's CPU has no float16 matmul)\n";
        continue;
      }
      MixedPrecisionPolicy root = c.mp;
      root.output_dtype() = c.root_output;
      check_parity(ctx, {root, c.mp, c.mp}, std::string(c.name) + " (root: " + describe(root) + ")");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// Units with different policies nest (seed 000's BatchNorm kept in float32 inside a float16
// model): the second unit casts its bf16 input up to float32, computes in float32 and hands
// bf16 on; the root's output comes back as float32.
TEST_P(FullyShardMixedPrecision, NestedUnitsWithDifferentPolicies) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto bf16 = at::kBFloat16, f32 = at::kFloat;
    Policies p{policy(bf16, f32, f32), policy(bf16, f32), policy(f32, f32, bf16)};
    check_parity(ctx, p, "root bf16, second unit fp32");
  });
}

// CommDebugMode: a bf16 all-gather moves exactly half the bytes of float32's; the
// reduce-scatter moves reduce_dtype.
TEST_P(FullyShardMixedPrecision, CommBytesHalvedByBf16) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    auto bytes_of_step = [&](const MixedPrecisionPolicy& mp) {
      torch::manual_seed(0);
      FSDPSequential model = make_model({mp, mp, mp});
      CommDebugMode comm;
      model->forward(torch::randn({4, 7})).to(at::kFloat).sum().backward();
      EXPECT_EQ(comm.count("all_gather_into_tensor"), 5);
      EXPECT_EQ(comm.count("reduce_scatter_tensor"), 3);
      return std::make_pair(comm.bytes_sent("all_gather_into_tensor"), comm.bytes_sent("reduce_scatter_tensor"));
    };
    const auto fp32 = bytes_of_step({});
    const auto bf16_fp32 = bytes_of_step(policy(at::kBFloat16, at::kFloat));
    const auto bf16 = bytes_of_step(policy(at::kBFloat16));
    if (n > 1) {
      EXPECT_GT(fp32.first, 0);
    }
    EXPECT_EQ(2 * bf16_fp32.first, fp32.first) << "all-gather bytes";
    EXPECT_EQ(bf16_fp32.second, fp32.second) << "a float32 reduce-scatter moves float32";
    EXPECT_EQ(2 * bf16.second, fp32.second) << "a bf16 reduce-scatter moves half";
  });
}

// Gradient accumulation without sync (FSDP2's test_gradient_accumulation under mixed
// precision): each unit sums its microbatches' bf16 gradients in reduce_dtype and reduces once.
TEST_P(FullyShardMixedPrecision, GradientAccumulationSumsInReduceDtype) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int64_t local = kGlobalBatch / ctx.world_size;
    const int micro = local % 2 == 0 ? 2 : 3;
    const std::vector<std::pair<std::string, MixedPrecisionPolicy>> cases{
        {"fp32 reduce", policy(at::kBFloat16, at::kFloat)}, {"bf16 reduce", policy(at::kBFloat16)}};
    for (const auto& [name, mp] : cases) {
      MixedPrecisionPolicy root = mp;
      root.output_dtype() = at::kFloat;
      check_parity(ctx, {root, mp, mp}, name + ", " + std::to_string(micro) + " microbatches", micro);
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// A unit that records what its wrapped Linear computes with.
struct ProbeImpl : torch::nn::Module {
  ProbeImpl() : fc(register_module("fc", Linear(6, 5))) {}
  at::Tensor forward(at::Tensor x) {
    weight_dtype = fc->weight.scalar_type();
    weight_sizes = fc->weight.sizes().vec();
    input_dtype = x.scalar_type();
    return fc(x);
  }
  Linear fc;
  at::ScalarType weight_dtype = at::kFloat, input_dtype = at::kFloat;
  std::vector<int64_t> weight_sizes;
};
TORCH_MODULE(Probe);

TEST_P(FullyShardMixedPrecision, DtypesAtEachStage) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    torch::manual_seed(0);
    Probe probe;
    const at::Tensor initial = probe->fc->weight.detach().clone();
    FullyShardedDataParallel<ProbeImpl> model(probe, FullyShardOptions().mp_policy(policy(at::kBFloat16)));
    const at::Tensor& weight = probe->fc->weight;
    EXPECT_EQ(weight.scalar_type(), at::kFloat) << "sharded at rest, in float32";
    EXPECT_TRUE(at::equal(weight, shard_rows(initial, rank, n)));

    at::Tensor out = model->forward(torch::randn({3, 6}));
    EXPECT_EQ(probe->input_dtype, at::kBFloat16) << "cast_forward_inputs";
    EXPECT_EQ(probe->weight_dtype, at::kBFloat16) << "computes with bf16 parameters";
    EXPECT_EQ(probe->weight_sizes, (std::vector<int64_t>{5, 6}));
    EXPECT_EQ(out.scalar_type(), at::kBFloat16) << "no output_dtype: as computed";
    out.to(at::kFloat).sum().backward();
    EXPECT_EQ(weight.scalar_type(), at::kFloat);
    EXPECT_EQ(weight.grad().scalar_type(), at::kFloat);
    EXPECT_EQ(weight.grad().sizes(), shard_rows(initial, rank, n).sizes());

    // FSDP2's unshard(): the compute dtype.
    model->unshard();
    EXPECT_EQ(weight.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(at::equal(weight, initial.to(at::kBFloat16)));
    model->reshard();
    // FSDP1's summon_full_params: the parameters' own dtype and exact values; writeback keeps edits.
    {
      auto full = summon_full_params(*model);
      EXPECT_EQ(weight.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(weight, initial));
      torch::NoGradGuard no_grad;
      weight.mul_(3);
    }
    EXPECT_EQ(weight.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(weight, shard_rows(initial * 3, rank, n)));

    // cast_forward_inputs(false): the input stays float32 (and the float32 x bf16 matmul fails
    // in the module, as it does in PyTorch).
    Probe probe2;
    FullyShardedDataParallel<ProbeImpl> uncast(
        probe2, FullyShardOptions().mp_policy(policy(at::kBFloat16).cast_forward_inputs(false)));
    uncast->forward(torch::randn({3, 6}).to(at::kBFloat16));
    EXPECT_EQ(probe2->input_dtype, at::kBFloat16);
    EXPECT_ANY_THROW(uncast->forward(torch::randn({3, 6})));
  });
}

// Seed 000's mixed-precision state dicts (its float16 is a GPU's; bf16 here, which every CPU
// libtorch computes in): FULL, SHARDED and LOCAL hold the float32 values, a float32 plain
// model loads the FULL one, and a mixed-precision model loads each back.
TEST_P(FullyShardMixedPrecision, StateDictsHoldFloat32) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto mp = policy(at::kBFloat16, at::kBFloat16);
    torch::manual_seed(0);
    FSDPSequential model = make_model({mp, mp, mp});
    torch::optim::SGD opt(model->parameters(), 0.1);
    for (int i = 0; i < 3; ++i) {
      at::Tensor loss = model->forward(torch::randn({2, 7})).sum();
      EXPECT_EQ(loss.scalar_type(), at::kBFloat16);
      loss.backward();
      opt.step();
      opt.zero_grad();
    }
    const auto trained = full_params(*model);
    Sequential plain = make_multi_group(false, {});
    {
      auto scope = state_dict_type(*model, StateDictType::FULL_STATE_DICT);
      StateDict sd = state_dict(*model);
      for (const auto& [key, value] : sd) EXPECT_EQ(value.dtype(), at::kFloat) << key;
      load_state_dict(*plain, sd);
      auto plain_params = plain->parameters();
      for (size_t i = 0; i < trained.size(); ++i) EXPECT_TRUE(at::equal(plain_params[i], trained[i])) << i;
    }
    for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT,
                               StateDictType::LOCAL_STATE_DICT}) {
      auto scope = state_dict_type(*model, type);
      StateDict sd = state_dict(*model);
      for (const auto& [key, value] : sd) EXPECT_EQ(value.dtype(), at::kFloat) << to_string(type) << " " << key;
      torch::manual_seed(7);
      FSDPSequential fresh = make_model({mp, mp, mp});
      auto fresh_scope = state_dict_type(*fresh, type);
      load_state_dict(*fresh, sd);
      auto loaded = full_params(*fresh);
      for (size_t i = 0; i < trained.size(); ++i)
        EXPECT_TRUE(at::equal(loaded[i], trained[i])) << to_string(type) << " param " << i;
    }
  });
}

// A param_dtype that is not floating point: refused naming the unit, the module untouched.
TEST(FullyShardMixedPrecisionErrors, NonFloatingDtypeIsRefused) {
  run_ranks(1, [](RankContext&) {
    Linear lin(4, 3);
    const at::Tensor before = lin->weight.detach().clone();
    try {
      FSDPLinear unit(lin, FullyShardOptions().mp_policy(policy(at::kLong)));
      FAIL() << "accepted param_dtype Long";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("param_dtype Long is not a floating-point dtype"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("Linear"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(at::equal(lin->weight, before)) << "the module is unchanged";
    EXPECT_THROW(FSDPLinear(lin, FullyShardOptions().mp_policy(policy(std::nullopt, at::kInt))), Error);
    // The module can still be wrapped afterwards.
    FSDPLinear ok(lin, FullyShardOptions().mp_policy(policy(at::kBFloat16)));
    EXPECT_EQ(ok->forward(torch::randn({2, 4})).scalar_type(), at::kBFloat16);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardMixedPrecision);

}  // namespace
}  // namespace fsdpp

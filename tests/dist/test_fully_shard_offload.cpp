// FSDP2's CPUOffloadPolicy (seed 001's test_train_parity_multi_group_cpu_offload_eager): parity
// with the single-process reference, the shards, their gradients and the optimizer state in
// host memory, state dicts, offload together with mixed precision, and misuse. On these
// CPU-only machines the compute device is the CPU too, so the copies to and from it are the
// identity: what is tested is the semantics and the placement, not a transfer to a GPU.
#include <fsdpp/error.h>
#include <fsdpp/memory.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"

namespace fsdpp {
namespace {

class FullyShardCPUOffload : public testing::WorldSizeTest {};

// Every tensor the optimizer keeps for the model's parameters (momentum, Adam's moments).
std::vector<at::Tensor> optimizer_state_tensors(torch::optim::Optimizer& opt) {
  std::vector<at::Tensor> out;
  for (const auto& [key, state] : opt.state()) {
    (void)key;
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      out.push_back(adam->exp_avg());
      out.push_back(adam->exp_avg_sq());
    } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      out.push_back(sgd->momentum_buffer());
    }
  }
  return out;
}

// A few steps of make_multi_group under `options` on this rank's slice of a fixed batch;
// returns the trained full parameters.
std::vector<at::Tensor> train(RankContext& ctx, const FullyShardOptions& options, int steps, Optim optim,
                              FSDPSequential* out = nullptr) {
  torch::manual_seed(42);
  FSDPSequential model(make_multi_group(true, options), options);
  auto opt = make_optimizer(optim, model->parameters());
  const int64_t local = kGlobalBatch / ctx.world_size;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 + step);
    at::Tensor x = torch::randn({kGlobalBatch, 7}).narrow(0, ctx.rank * local, local);
    opt->zero_grad();
    model->forward(x).pow(2).mean().backward();
    opt->step();
  }
  if (out) *out = model;
  return full_params(*model);
}

// Seed 001 test_train_parity_multi_group_cpu_offload_eager: CPUOffloadPolicy pin_memory T/F x
// the four delay flags swept independently (the seed's 16 combinations) with Adam, at
// reshard_after_forward True as the seed, the way FullyShard1DTrainingCore.TrainParityMultiGroup
// runs them (ParityCase::for_delay_mask); and SGD without delays.
TEST_P(FullyShardCPUOffload, TrainParityMultiGroupCpuOffloadEager) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (bool pin_memory : {true, false})
      for (int mask = -1; mask < 16; ++mask) {  // -1: SGD, no delays
        const ParityCase c = ParityCase::for_delay_mask(mask);
        const auto options =
            FullyShardOptions().reshard_after_forward(true).offload_policy(CPUOffloadPolicy().pin_memory(pin_memory));
        FSDPSequential model =
            check_multi_group_parity(ctx, options, c, "pin_memory " + std::to_string(pin_memory) + " " + c.delays_name());
        for (const auto& p : model->parameters()) {
          EXPECT_TRUE(p.device().is_cpu());
          ASSERT_TRUE(p.grad().defined());
          EXPECT_TRUE(p.grad().device().is_cpu());
        }
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// The shards, their `.grad` and the optimizer's state are host tensors; pinning is skipped
// when the compute device is the CPU itself. Training matches the same model without offload
// bit for bit (the same arithmetic in the same order).
TEST_P(FullyShardCPUOffload, ShardsGradientsAndOptimizerStateOnTheHost) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    for (Optim optim : {Optim::kSGD, Optim::kAdam}) {
      const auto offloaded = FullyShardOptions().offload_policy(CPUOffloadPolicy());
      torch::manual_seed(42);
      FSDPSequential model(make_multi_group(true, offloaded), offloaded);
      auto opt = make_optimizer(optim, model->parameters());
      torch::manual_seed(3);
      model->forward(torch::randn({4, 7})).sum().backward();
      opt->step();
      for (const auto& p : model->named_parameters()) {
        EXPECT_TRUE(p.value().device().is_cpu()) << p.key();
        EXPECT_FALSE(p.value().is_pinned()) << p.key() << ": nothing to pin for on a CPU compute device";
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_TRUE(p.value().grad().device().is_cpu()) << p.key();
        EXPECT_EQ(p.value().grad().sizes(), p.value().sizes()) << p.key() << ": the gradient is shard-shaped";
      }
      auto state = optimizer_state_tensors(*opt);
      EXPECT_EQ(state.size(), model->parameters().size() * (optim == Optim::kAdam ? 2 : 1));
      for (const auto& t : state) EXPECT_TRUE(t.device().is_cpu());

      auto with = train(ctx, offloaded, 4, optim);
      auto without = train(ctx, FullyShardOptions(), 4, optim);
      for (size_t i = 0; i < with.size(); ++i)
        EXPECT_TRUE(at::equal(with[i], without[i])) << name_of(optim) << " param " << i;
    }
  });
}

// Offload composes with mixed precision: the all-gather input is the bfloat16 cast, copied to
// the compute device; the reduced float32 gradient lands on the host.
TEST_P(FullyShardCPUOffload, WithMixedPrecision) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto mp = MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
    FSDPSequential model{nullptr};
    auto with = train(ctx, FullyShardOptions().mp_policy(mp).offload_policy(CPUOffloadPolicy()), 3, Optim::kAdam, &model);
    auto without = train(ctx, FullyShardOptions().mp_policy(mp), 3, Optim::kAdam);
    for (size_t i = 0; i < with.size(); ++i) EXPECT_TRUE(at::equal(with[i], without[i])) << "param " << i;
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), at::kFloat);
      EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
      EXPECT_TRUE(p.grad().device().is_cpu());
    }
  });
}

// FULL, SHARDED and LOCAL state dicts of an offloaded model hold the trained values and load
// into a fresh offloaded model.
TEST_P(FullyShardCPUOffload, StateDicts) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const auto options = FullyShardOptions().offload_policy(CPUOffloadPolicy());
    FSDPSequential model{nullptr};
    auto trained = train(ctx, options, 2, Optim::kSGD, &model);
    for (StateDictType type : {StateDictType::FULL_STATE_DICT, StateDictType::SHARDED_STATE_DICT,
                               StateDictType::LOCAL_STATE_DICT}) {
      auto scope = state_dict_type(*model, type);
      StateDict sd = state_dict(*model);
      torch::manual_seed(7);
      FSDPSequential fresh(make_multi_group(true, options), options);
      auto fresh_scope = state_dict_type(*fresh, type);
      load_state_dict(*fresh, sd);
      auto loaded = full_params(*fresh);
      for (size_t i = 0; i < trained.size(); ++i)
        EXPECT_TRUE(at::equal(loaded[i], trained[i])) << to_string(type) << " param " << i;
      for (const auto& p : fresh->parameters()) EXPECT_TRUE(p.device().is_cpu());
    }
  });
}

// What CPU offload promises that a CPU compute device can still show (the parity tests above
// cannot fail on CPU ranks: an offload that does nothing passes them). A Linear that records the
// storage of the weight it computes with (the gathered parameter, swapped in by its unit).
struct RecordingLinearImpl : torch::nn::LinearImpl {
  using LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& x) {
    computed_with.push_back(weight.storage().data_ptr().get());
    return LinearImpl::forward(x);
  }
  std::vector<const void*> computed_with;
};
TORCH_MODULE(RecordingLinear);
using FSDPRecordingLinear = FullyShardedDataParallel<RecordingLinearImpl>;

// make_multi_group's shapes with recording Linears: two inner units and the root's Linear.
struct OffloadedModel {
  OffloadedModel(const FullyShardOptions& options, bool wrap) {
    torch::manual_seed(42);
    l1 = RecordingLinear(7, 15);
    l2 = RecordingLinear(15, 15);
    Linear l3(15, 3);
    model = wrap ? Sequential(FSDPRecordingLinear(l1, options), ReLU(), FSDPRecordingLinear(l2, options), ReLU(), l3)
                 : Sequential(l1, ReLU(), l2, ReLU(), l3);
    if (wrap) root = FSDPSequential(model, options);
  }
  at::Tensor forward(const at::Tensor& x) { return root ? root->forward(x) : model->forward(x); }
  torch::nn::Module& module() { return root ? static_cast<torch::nn::Module&>(*root) : *model; }
  RecordingLinear l1{nullptr}, l2{nullptr};
  Sequential model{nullptr};
  FSDPSequential root{nullptr};
};

const void* storage_of(const at::Tensor& t) { return t.storage().data_ptr().get(); }

std::vector<std::pair<OffloadPolicy, std::string>> offload_policies() {
  return {{CPUOffloadPolicy(), "pin_memory T"}, {CPUOffloadPolicy().pin_memory(false), "pin_memory F"}};
}

// The units' Linears compute with gathered parameters whose storage is not the host shards'
// (the optimizer's tensors), and the host shards stay where they were across steps (the
// optimizer steps them in place); pin_memory T or F, nothing is pinned on a CPU compute device
// (offload_policy.h: pinning only applies when the compute device is not the CPU).
TEST_P(FullyShardCPUOffload, GatheredParametersAreNotTheHostShards) {
  run_ranks(GetParam(), [](RankContext&) {
    for (const auto& [policy, name] : offload_policies()) {
      OffloadedModel m(FullyShardOptions().offload_policy(policy), true);
      auto params = m.module().parameters();
      std::vector<const void*> host;
      for (const auto& p : params) {
        host.push_back(storage_of(p));
        EXPECT_TRUE(p.device().is_cpu()) << name;
        EXPECT_FALSE(p.is_pinned()) << name << ": nothing to pin for on a CPU compute device";
      }
      torch::optim::SGD opt(params, 0.1);
      for (int step = 0; step < 2; ++step) {
        opt.zero_grad();
        torch::manual_seed(step);
        m.forward(torch::randn({4, 7})).pow(2).sum().backward();
        opt.step();
      }
      ASSERT_EQ(m.l1->computed_with.size(), 2u) << name;
      ASSERT_EQ(m.l2->computed_with.size(), 2u) << name;
      for (const auto* lin : {m.l1.get(), m.l2.get()})
        for (const void* gathered : lin->computed_with)
          for (size_t i = 0; i < host.size(); ++i)
            EXPECT_NE(gathered, host[i]) << name << ": a unit computed with host shard storage (param " << i << ")";
      params = m.module().parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(storage_of(params[i]), host[i]) << name << " param " << i << ": the host shard moved";
        ASSERT_TRUE(params[i].grad().defined()) << name;
        EXPECT_FALSE(params[i].grad().is_pinned()) << name;
        for (size_t j = 0; j < host.size(); ++j)
          EXPECT_NE(storage_of(params[i].grad()), host[j]) << name << " grad " << i << " shares param " << j << "'s storage";
      }
    }
  });
}

// Each all-gather reads the host shards anew: a change made to them between steps (as a user's
// in-place edit or a CPU optimizer's step) is what the next forward computes with, the same
// change made to the plain model giving the same output.
TEST_P(FullyShardCPUOffload, AllGatherReadsTheHostShards) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    for (const auto& [policy, name] : offload_policies()) {
      OffloadedModel m(FullyShardOptions().offload_policy(policy), true), ref(FullyShardOptions(), false);
      for (int edit = 0; edit < 3; ++edit) {
        const std::string where = name + " edit " + std::to_string(edit);
        torch::manual_seed(7 + edit);
        at::Tensor x = torch::randn({kGlobalBatch, 7});
        {
          torch::NoGradGuard no_grad;
          expect_close(m.forward(x.narrow(0, rank * local, local)), ref.forward(x).narrow(0, rank * local, local), where);
          for (auto* model : {&m, &ref})
            for (auto& p : model->module().parameters()) p.mul_(-0.5).add_(0.25);
        }
        if (::testing::Test::HasFailure()) return;
      }
    }
  });
}

// The reduced gradient lands in the host shard's `.grad`: shard-shaped on the host, the plain
// model's gradient rows; a second backward without zeroing accumulates into that same tensor.
TEST_P(FullyShardCPUOffload, GradientsLandInTheHostShardsGrad) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, rank = ctx.rank;
    const int64_t local = kGlobalBatch / n;
    for (const auto& [policy, name] : offload_policies()) {
      OffloadedModel m(FullyShardOptions().offload_policy(policy), true), ref(FullyShardOptions(), false);
      torch::manual_seed(3);
      at::Tensor x = torch::randn({kGlobalBatch, 7});
      auto params = m.module().parameters(), ref_params = ref.module().parameters();
      m.forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
      ref.forward(x).pow(2).mean().backward();
      std::vector<at::Tensor> first;
      std::vector<const void*> grad_storage;
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& g = params[i].grad();
        ASSERT_TRUE(g.defined()) << name << " grad " << i;
        EXPECT_TRUE(g.device().is_cpu()) << name;
        expect_close(g, shard_rows(ref_params[i].grad(), rank, n), name + " grad " + std::to_string(i));
        first.push_back(g.clone());
        grad_storage.push_back(storage_of(g));
      }
      m.forward(x.narrow(0, rank * local, local)).pow(2).mean().backward();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(storage_of(params[i].grad()), grad_storage[i]) << name << " grad " << i << ": replaced, not accumulated into";
        EXPECT_TRUE(at::equal(params[i].grad(), first[i] * 2)) << name << " grad " << i;
      }
    }
  });
}

// On a CPU compute device the copies to and from it are the identity (offload_policy.h): a step
// with CPU offload allocates exactly what the same step without it allocates (an offload that
// copied each all-gather input or reduce-scatter output would allocate more).
TEST_P(FullyShardCPUOffload, NoCopiesOnACpuComputeDevice) {
  run_ranks(GetParam(), [](RankContext&) {
    auto allocations_per_step = [](const FullyShardOptions& options) {
      OffloadedModel m(options, true);
      torch::optim::SGD opt(m.module().parameters(), 0.1);
      std::vector<int64_t> counts;
      for (int step = 0; step < 3; ++step) {
        torch::manual_seed(step);
        at::Tensor x = torch::randn({4, 7});
        const int64_t before = memory_stats().num_allocations;
        opt.zero_grad();
        m.forward(x).pow(2).sum().backward();
        opt.step();
        counts.push_back(memory_stats().num_allocations - before);
      }
      return counts;
    };
    const auto without = allocations_per_step(FullyShardOptions());
    for (const auto& [policy, name] : offload_policies())
      EXPECT_EQ(allocations_per_step(FullyShardOptions().offload_policy(policy)), without) << name;
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(FullyShardCPUOffload);

}  // namespace
}  // namespace fsdpp

// Seed 003 (PyTorch's test_fsdp_model_state.py): an FSDP model's SHARDED state dict saved with the
// distributed checkpoint and loaded into an FSDP model on the same ranks, or on two process
// groups of half the ranks (even and odd), which reshards on load. Values are only copied, so
// they must be equal bitwise. The models are built on the meta device, as the seed's.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/deferred_init.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/state_dict.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_test_util.h"
#include "dist/fsdp_test_util.h"
#include "dist/world_sizes.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;

std::map<std::string, at::Tensor> full_values(FSDPLinear& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, value] : get_model_state_dict(model, StateDictOptions().full_state_dict(true)))
    out[key] = value.tensor().clone();
  return out;
}

// The seed's models: Linear(8, 8, device="meta") wrapped, then initialized per shard (FSDP1
// calls reset_parameters() on a meta module; here materialize_module does). model_2 takes
// another seed: in PyTorch it differs because the generator has moved on, here each module's
// values depend only on the seed and its name.
FSDPLinear deferred_linear(uint64_t seed, const FullyShardOptions& options = {}) {
  FSDPLinear model(deferred_init([] { return torch::nn::Linear(8, 8); }), options);
  materialize_module(*model, MaterializeOptions().seed(seed));
  return model;
}

void fsdp_model_state(RankContext& ctx, const ProcessGroup& group) {
  const std::string dir = ctx.temp_dir + "/ckpt";
  FSDPLinear model = deferred_linear(0);
  torch::manual_seed(ctx.rank + 100);
  model->forward(torch::rand({8, 8})).sum().backward();
  {
    auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
    StateDict sd = state_dict(model);
    EXPECT_TRUE(sd.at("weight").is_sharded());
    ckpt::State state = ckpt::to_state(sd, "model.");
    ckpt::save(state, dir);
  }
  const auto saved = full_values(model);

  FSDPLinear model_2 = deferred_linear(1, FullyShardOptions().process_group(group));  // another initialisation
  auto before = full_values(model_2);
  EXPECT_FALSE(at::equal(before.at("weight"), saved.at("weight")));
  EXPECT_FALSE(at::equal(before.at("bias"), saved.at("bias")));
  {
    auto scope = state_dict_type(*model_2.ptr(), StateDictType::SHARDED_STATE_DICT);
    StateDict sd2 = state_dict(model_2);
    ckpt::State state = ckpt::to_state(sd2, "model.");
    ckpt::load(state, dir);  // fills sd2's shards
    load_state_dict(model_2, sd2);
  }
  const auto loaded = full_values(model_2);
  for (const auto& [key, value] : saved) EXPECT_TRUE(at::equal(loaded.at(key), value)) << key;
  barrier(ctx.world);
}

class CheckpointFsdp : public testing::WorldSizeTest {};

TEST_P(CheckpointFsdp, FsdpModelStateNoResharding) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) { fsdp_model_state(ctx, ctx.world); });
}
FSDPP_INSTANTIATE_WORLD_SIZES(CheckpointFsdp);

TEST(CheckpointFsdp4Ranks, FsdpModelStateWithResharding) {
  testing::run_ranks(4, [](RankContext& ctx) {
    ProcessGroup evens = ctx.world.new_group({0, 2});
    ProcessGroup odds = ctx.world.new_group({1, 3});
    fsdp_model_state(ctx, ctx.rank % 2 ? odds : evens);
  });
}

// The StateDict overloads: save(sd) / load(sd) with plain keys, into a model at another world size.
TEST(CheckpointFsdp4Ranks, StateDictOverloadsReshard4To3) {
  testing::run_ranks(4, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    torch::manual_seed(0);
    FSDPLinear model(torch::nn::Linear(10, 5));
    {
      auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(state_dict(model), dir);
    }
    const auto saved = full_values(model);
    ProcessGroup three = ctx.world.new_group({0, 1, 2});
    if (ctx.rank < 3) {
      torch::manual_seed(5);
      FSDPLinear model_3(torch::nn::Linear(10, 5), FullyShardOptions().process_group(three));
      auto scope = state_dict_type(*model_3.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(model_3);
      ckpt::load(sd, dir);
      load_state_dict(model_3, sd);
      auto loaded = full_values(model_3);
      for (const auto& [key, value] : saved) EXPECT_TRUE(at::equal(loaded.at(key), value)) << key;
    }
    barrier(ctx.world);
  });
}

// FSDP <-> plain model: an FSDP model's sharded checkpoint (3 ranks) loads into the plain
// model (whole tensors, rank 0 alone), and the plain model's checkpoint, saved by rank 0 alone,
// loads into a fresh FSDP model on all 3 ranks.
TEST(CheckpointFsdp3Ranks, FsdpToPlainModelAndBack) {
  testing::run_ranks(3, [](RankContext& ctx) {
    const std::string from_fsdp = ctx.temp_dir + "/from_fsdp", from_plain = ctx.temp_dir + "/from_plain";
    ProcessGroup rank0 = ctx.world.new_group({0});
    torch::manual_seed(0);
    FSDPLinear model(torch::nn::Linear(8, 5));
    torch::manual_seed(7);
    model->forward(torch::rand({4, 8})).sum().backward();
    {
      auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(state_dict(model), from_fsdp);
    }
    const auto saved = full_values(model);
    if (ctx.rank == 0) {
      torch::manual_seed(3);
      torch::nn::Linear plain(8, 5);
      StateDict sd = get_model_state_dict(*plain.ptr());
      ASSERT_TRUE(sd.at("weight").is_tensor());
      ckpt::load(sd, from_fsdp);
      set_model_state_dict(*plain.ptr(), sd);
      EXPECT_TRUE(at::equal(plain->weight, saved.at("weight")));
      EXPECT_TRUE(at::equal(plain->bias, saved.at("bias")));
      torch::NoGradGuard no_grad;
      plain->weight.mul_(2);
      ckpt::save(get_model_state_dict(*plain.ptr()), from_plain, ckpt::SaveOptions().process_group(rank0));
    }
    barrier(ctx.world);
    torch::manual_seed(9);
    FSDPLinear fresh(torch::nn::Linear(8, 5));
    {
      auto scope = state_dict_type(*fresh.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(fresh);
      ckpt::load(sd, from_plain);
      load_state_dict(fresh, sd);
    }
    const auto loaded = full_values(fresh);
    EXPECT_TRUE(at::equal(loaded.at("weight"), saved.at("weight") * 2));
    EXPECT_TRUE(at::equal(loaded.at("bias"), saved.at("bias")));
  });
}

// FSDP <-> DDP: fsdpp's DDP wraps the model in place (no "module." prefix), so a DDP-trained
// model's state dict is the plain model's, replicated on every rank (written once). DDP trains
// 2 steps and checkpoints; a differently initialised FSDP model loads the checkpoint and its
// steps 2-3 give the losses and parameters of DDP going on (the same trajectory); FSDP then
// checkpoints, and a fresh DDP model that loads it continues FSDP's trajectory: its steps 4-5
// give the losses and parameters of FSDP going on. Each rank trains on its half of every
// global batch; both systems average the gradient over the ranks, so the trajectories agree
// to float32 rounding (rtol 1.3e-6, atol 1e-5), while a model that failed to load starts from
// other values and its losses differ by far more.
TEST(CheckpointFsdp2Ranks, DdpToFsdpAndBack) {
  testing::run_ranks(2, [](RankContext& ctx) {
    using DDPLinear = DistributedDataParallel<torch::nn::LinearImpl>;
    const std::string from_ddp = ctx.temp_dir + "/from_ddp", from_fsdp = ctx.temp_dir + "/from_fsdp";
    auto step_of = [&](auto&& forward, torch::optim::Optimizer& opt, int step) {
      torch::manual_seed(1000 + step);
      at::Tensor x = torch::randn({8, 8}), y = torch::randn({8, 5});
      opt.zero_grad();
      at::Tensor loss = torch::mse_loss(forward(x.narrow(0, 4 * ctx.rank, 4)), y.narrow(0, 4 * ctx.rank, 4));
      loss.backward();
      opt.step();
      return loss.item<double>();
    };
    auto expect_close = [](double actual, double expected, const std::string& what) {
      EXPECT_LE(std::abs(actual - expected), 1e-5 + 1.3e-6 * std::abs(expected)) << what << ": " << actual << " vs " << expected;
    };
    auto expect_values_close = [](const std::map<std::string, at::Tensor>& actual, torch::nn::Linear& plain,
                                  const std::string& what) {
      EXPECT_TRUE(at::allclose(actual.at("weight"), plain->weight.detach(), 1.3e-6, 1e-5)) << what << " weight";
      EXPECT_TRUE(at::allclose(actual.at("bias"), plain->bias.detach(), 1.3e-6, 1e-5)) << what << " bias";
    };

    torch::manual_seed(0);
    torch::nn::Linear plain(8, 5);
    DDPLinear ddp(plain);
    torch::optim::SGD opt(plain->parameters(), 0.1);
    auto ddp_forward = [&](const at::Tensor& x) { return ddp.forward(x); };
    for (int step = 0; step < 2; ++step) step_of(ddp_forward, opt, step);
    ckpt::save(get_model_state_dict(*plain.ptr()), from_ddp);

    torch::manual_seed(9);
    FSDPLinear fsdp(torch::nn::Linear(8, 5));
    torch::optim::SGD fsdp_opt(fsdp->parameters(), 0.1);
    auto fsdp_forward = [&](const at::Tensor& x) { return fsdp->forward(x); };
    EXPECT_FALSE(at::equal(full_values(fsdp).at("weight"), plain->weight.detach())) << "FSDP starts elsewhere";
    {
      auto scope = state_dict_type(*fsdp.ptr(), StateDictType::SHARDED_STATE_DICT);
      StateDict sd = state_dict(fsdp);
      ckpt::load(sd, from_ddp);
      load_state_dict(fsdp, sd);
    }
    auto loaded = full_values(fsdp);
    EXPECT_TRUE(at::equal(loaded.at("weight"), plain->weight.detach()));
    EXPECT_TRUE(at::equal(loaded.at("bias"), plain->bias.detach()));
    for (int step = 2; step < 4; ++step) {
      const double fsdp_loss = step_of(fsdp_forward, fsdp_opt, step);
      const double ddp_loss = step_of(ddp_forward, opt, step);
      expect_close(fsdp_loss, ddp_loss, "FSDP from DDP's checkpoint, step " + std::to_string(step));
    }
    expect_values_close(full_values(fsdp), plain, "FSDP after steps 2-3");

    {
      auto scope = state_dict_type(*fsdp.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(state_dict(fsdp), from_fsdp);
    }
    const auto saved = full_values(fsdp);
    torch::manual_seed(13);
    torch::nn::Linear plain2(8, 5);
    DDPLinear ddp2(plain2);
    torch::optim::SGD opt2(plain2->parameters(), 0.1);
    auto ddp2_forward = [&](const at::Tensor& x) { return ddp2.forward(x); };
    EXPECT_FALSE(at::equal(plain2->weight.detach(), saved.at("weight"))) << "the second DDP model starts elsewhere";
    StateDict sd = get_model_state_dict(*plain2.ptr());
    ckpt::load(sd, from_fsdp);
    set_model_state_dict(*plain2.ptr(), sd);
    EXPECT_TRUE(at::equal(plain2->weight.detach(), saved.at("weight")));
    EXPECT_TRUE(at::equal(plain2->bias.detach(), saved.at("bias")));
    for (int step = 4; step < 6; ++step) {
      const double ddp_loss = step_of(ddp2_forward, opt2, step);
      const double fsdp_loss = step_of(fsdp_forward, fsdp_opt, step);
      expect_close(ddp_loss, fsdp_loss, "DDP from FSDP's checkpoint, step " + std::to_string(step));
    }
    expect_values_close(full_values(fsdp), plain2, "DDP after steps 4-5");
  });
}

// ---- resume from a checkpoint ----------------------------------------------------------------

constexpr int64_t kBatch = 12;  // divisible by every world size

// Linear(6, 10) as an inner unit, ReLU, Linear(10, 3) sharded by the root; or the plain model.
torch::nn::Sequential plain_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(6, 10), torch::nn::ReLU(), torch::nn::Linear(10, 3));
}
FSDPSequential fsdp_net(const ProcessGroup& group) {
  torch::manual_seed(0);
  auto opts = FullyShardOptions().process_group(group);
  torch::nn::Sequential net(FSDPLinear(torch::nn::Linear(6, 10), opts), torch::nn::ReLU(), torch::nn::Linear(10, 3));
  return FSDPSequential(net, opts);
}

// One step on this rank's slice of global batch `step`; returns the local loss.
template <typename Model>
float train_step(Model& model, torch::optim::Optimizer& opt, int step, int rank, int n) {
  torch::manual_seed(1000 + step);
  at::Tensor x = torch::randn({kBatch, 6}), y = torch::randn({kBatch, 3});
  const int64_t per = kBatch / n;
  opt.zero_grad();
  at::Tensor loss = torch::mse_loss(model->forward(x.slice(0, rank * per, (rank + 1) * per)),
                                    y.slice(0, rank * per, (rank + 1) * per));
  loss.backward();
  opt.step();
  return loss.item<float>();
}

struct Resume {
  int save_world, load_world;
};
void PrintTo(const Resume& p, std::ostream* os) { *os << p.save_world << " -> " << p.load_world << " ranks"; }
class CheckpointResume : public ::testing::TestWithParam<Resume> {};

// Issue 6's resume test: Adam trains 3 steps at N ranks; the SHARDED model and optimizer state
// dicts and the step go into one checkpoint; a fresh model and optimizer (another learning rate)
// on M ranks load it and train 3 more steps. At M == N the losses and parameters equal the
// uninterrupted run's bitwise; otherwise the parameters match single-process training of all
// 6 steps within float32 tolerance (rtol 1.3e-6, atol 1e-5: the ranks sum gradients in another
// order).
TEST_P(CheckpointResume, ModelOptimizerAndStep) {
  const auto [n, m] = GetParam();
  testing::run_ranks(std::max(n, m), [n = n, m = m](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    std::vector<int> first_n, first_m;
    for (int r = 0; r < n; ++r) first_n.push_back(r);
    for (int r = 0; r < m; ++r) first_m.push_back(r);
    ProcessGroup group_n = n == ctx.world_size ? ctx.world : ctx.world.new_group(first_n);
    ProcessGroup group_m = m == ctx.world_size ? ctx.world : ctx.world.new_group(first_m);
    std::vector<float> uninterrupted;
    std::map<std::string, at::Tensor> uninterrupted_params;
    if (ctx.rank < n) {
      FSDPSequential straight = fsdp_net(group_n);
      torch::optim::Adam straight_opt(straight->parameters(), torch::optim::AdamOptions(1e-2));
      for (int step = 0; step < 6; ++step) uninterrupted.push_back(train_step(straight, straight_opt, step, ctx.rank, n));
      for (const auto& [key, v] : get_model_state_dict(straight, StateDictOptions().full_state_dict(true)))
        uninterrupted_params[key] = v.tensor().clone();

      FSDPSequential model = fsdp_net(group_n);
      torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
      for (int step = 0; step < 3; ++step) train_step(model, opt, step, ctx.rank, n);
      ckpt::State state = ckpt::to_state(get_model_state_dict(model), "model.");
      state.merge(ckpt::to_state(get_optimizer_state_dict(model, opt), "optim."));
      state["step"] = int64_t{3};
      ckpt::save(state, dir, ckpt::SaveOptions().process_group(group_n));
    }
    barrier(ctx.world);
    if (ctx.rank < m) {
      FSDPSequential model = fsdp_net(group_m);
      torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(0.5));
      const int resumed_at = static_cast<int>(load_checkpoint(*model, opt, dir, {{"step", 0}}).at("step").to_int());
      EXPECT_DOUBLE_EQ(opt.param_groups()[0].options().get_lr(), 1e-2);
      ASSERT_EQ(resumed_at, 3);
      for (int step = resumed_at; step < 6; ++step) {
        const float loss = train_step(model, opt, step, ctx.rank, m);
        if (m == n) {
          EXPECT_EQ(loss, uninterrupted[step]) << "step " << step;
        }
      }
      auto plain = plain_net();
      torch::optim::Adam plain_opt(plain->parameters(), torch::optim::AdamOptions(1e-2));
      for (int step = 0; step < 6; ++step) train_step(plain, plain_opt, step, 0, 1);
      auto plain_params = plain->named_parameters();
      for (const auto& [key, v] : get_model_state_dict(model, StateDictOptions().full_state_dict(true))) {
        if (m == n) {
          EXPECT_TRUE(at::equal(v.tensor(), uninterrupted_params.at(key))) << key;
        }
        EXPECT_TRUE(at::allclose(v.tensor(), plain_params[key], 1.3e-6, 1e-5)) << key;
      }
    }
    barrier(ctx.world);
  });
}
INSTANTIATE_TEST_SUITE_P(, CheckpointResume,
                         ::testing::Values(Resume{2, 2}, Resume{4, 4}, Resume{4, 2}, Resume{2, 3}, Resume{3, 1}),
                         [](const ::testing::TestParamInfo<Resume>& info) {
                           return "Save" + std::to_string(info.param.save_world) + "Load" +
                                  std::to_string(info.param.load_world);
                         });


// Python's own safetensors package (Hugging Face's) reads what fsdpp writes: each rank's data
// file of a sharded FSDP checkpoint (7 rows on 2 ranks, so one shard is padded) and the file
// `fsdpp-ckpt consolidate` makes; every tensor equals the model's full state dict.
TEST(CheckpointInterop, PythonSafetensorsReadsRankFilesAndConsolidated) {
  int status = 0;
  testing::run_command(testing::python() + " -c 'import safetensors' 2>/dev/null", status);
  ASSERT_EQ(status, 0) << testing::python() << " has no safetensors package (scripts/install-deps.sh installs it)";
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    torch::manual_seed(0);
    FSDPLinear model(torch::nn::Linear(5, 7));
    model->forward(torch::rand({3, 5})).sum().backward();
    {
      auto scope = state_dict_type(*model.ptr(), StateDictType::SHARDED_STATE_DICT);
      ckpt::save(ckpt::to_state(state_dict(model), "model."), dir);
    }
    const auto full = full_values(model);
    if (ctx.rank != 0) return;
    int status = 0;
    nlohmann::json expected;
    for (const auto& [key, value] : full)
      expected["model." + key] = {{"shape", value.sizes().vec()}, {"hex", testing::hex_of(value)}};
    std::ofstream(ctx.temp_dir + "/expected.json") << expected.dump();
    const std::string consolidated = ctx.temp_dir + "/model.safetensors";
    std::string out = testing::run_command(testing::ckpt_tool() + " consolidate " + dir + " " + consolidated + " 2>&1", status);
    ASSERT_EQ(status, 0) << out;
    const std::string checker = (std::filesystem::path(testing::python_tool()).parent_path() / "check_with_safetensors.py").string();
    out = testing::run_command(testing::python() + " " + checker + " " + dir + " " + consolidated + " " + ctx.temp_dir + "/expected.json 2>&1", status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("ok: 2 tensors equal from 2 rank files"), std::string::npos) << out;
  });
}

}  // namespace
}  // namespace fsdpp

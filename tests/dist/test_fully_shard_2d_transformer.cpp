// A 2-D (FSDP x TP) transformer: seed 001's test_train_parity_2d_transformer_checkpoint_resume,
// and clip_grad_norm_ against the plain model.
// The seed's body is a stub; its docstring and sweep (use_seq_parallel, reuse_model_optim,
// Adam / AdamW) and issue 13 give the scenario: a 2-D transformer trains, saves model and
// optimizer with the distributed checkpoint, trains on; a fresh (or the same) model and optimizer
// load the checkpoint and train the same steps, at parity with the uninterrupted run. The
// checkpoint also resumes onto a 1-D FSDP layout and onto the plain model (resharding across
// layouts).
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include <fsdpp/checkpoint.h>
#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/tensor_parallel.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "harness/error_of.h"
#include "tp_transformer.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
using examples::TPTransformer;
using examples::TPTransformerBlockImpl;
using examples::TransformerArgs;

constexpr int64_t kBatch = 8, kSeq = 8;  // the global batch: split over dp (2-D) or the world (1-D)
constexpr int kSaveAt = 3, kSteps = 6;

TransformerArgs tiny_args() {
  TransformerArgs args;
  args.n_layers = 2;
  args.vocab_size = 32;
  args.max_seq_len = kSeq;
  args.dim = 16;
  args.n_heads = 4;  // 2 heads per rank at tp 2
  return args;
}

// The 2-D model: PyTorch's Transformer.parallelize plan (with or without sequence parallelism)
// over "tp", then each block and the root fully_shard over "dp". `seed` makes the initial values
// (fresh models differ from the saved one).
std::shared_ptr<torch::nn::Module> make_2d(const DeviceMesh& mesh, uint64_t seed, bool use_seq_parallel) {
  torch::manual_seed(seed);
  TPTransformer model(tiny_args());
  parallelize_module(*model, mesh["tp"], examples::tp_transformer_plan(tiny_args().n_layers, use_seq_parallel));
  return fully_shard(model, FullyShardOptions().mesh(mesh["dp"]).auto_wrap_policy(ModuleWrapPolicy<TPTransformerBlockImpl>()))
      .ptr();
}

// The same transformer untouched by TP (the plain model of the same keys), sharded over `group`
// per block and at the root, or plain when `group` is empty.
std::shared_ptr<torch::nn::Module> make_plain_or_1d(const ProcessGroup& group, uint64_t seed,
                                                    const TransformerArgs& args = tiny_args()) {
  torch::manual_seed(seed);
  examples::Transformer model(args);
  if (!group.defined()) return model.ptr();
  return fully_shard(model, FullyShardOptions().process_group(group).auto_wrap_policy(
                                ModuleWrapPolicy<examples::TransformerBlockImpl>()))
      .ptr();
}

at::Tensor forward(torch::nn::Module& model, const at::Tensor& tokens) {
  if (auto* m = dynamic_cast<FullyShardedDataParallelImpl<examples::TPTransformerImpl>*>(&model)) return m->forward(tokens);
  if (auto* m = dynamic_cast<FullyShardedDataParallelImpl<examples::TransformerImpl>*>(&model)) return m->forward(tokens);
  return dynamic_cast<examples::TransformerImpl&>(model).forward(tokens);
}

// One step on part `part` of `parts` of step `step`'s global batch (the same on every rank);
// `before_step` runs between backward and the optimizer.
float train_step(torch::nn::Module& model, torch::optim::Optimizer& opt, int step, int part, int parts,
                 const std::function<void()>& before_step = {}) {
  torch::manual_seed(1000 + step);
  at::Tensor tokens = torch::randint(tiny_args().vocab_size, {kBatch, kSeq}, torch::kLong);
  at::Tensor targets = torch::randint(tiny_args().vocab_size, {kBatch, kSeq}, torch::kLong);
  const int64_t rows = kBatch / parts;
  opt.zero_grad();
  at::Tensor loss = examples::language_model_loss(forward(model, tokens.narrow(0, part * rows, rows)),
                                                  targets.narrow(0, part * rows, rows));
  loss.backward();
  if (before_step) before_step();
  opt.step();
  return loss.item<float>();
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& model, bool adamw, double lr) {
  if (adamw) return std::make_unique<torch::optim::AdamW>(model.parameters(), torch::optim::AdamWOptions(lr));
  return std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(lr));
}

std::map<std::string, at::Tensor> full_values(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, v] : get_model_state_dict(model, StateDictOptions().full_state_dict(true))) out[key] = v.tensor();
  return out;
}

std::map<std::string, at::Tensor> full_optimizer_values(torch::nn::Module& model, const torch::optim::Optimizer& opt) {
  std::map<std::string, at::Tensor> out;
  const OptimizerStateDict osd = get_optimizer_state_dict(model, opt, StateDictOptions().full_state_dict(true));
  for (const auto& [key, v] : flatten_optimizer_state(osd)) out[key] = v.tensor();
  return out;
}

// Saves model and optimizer (SHARDED dicts) and the step, as a training loop does.
void save(torch::nn::Module& model, const torch::optim::Optimizer& opt, const std::string& dir) {
  ckpt::State state = ckpt::to_state(get_model_state_dict(model), "model.");
  state.merge(ckpt::to_state(get_optimizer_state_dict(model, opt), "optim."));
  state["step"] = int64_t{kSaveAt};
  ckpt::save(state, dir);
}

// Loads model and optimizer (which may have no state yet) from `dir`; returns the saved step.
int load(torch::nn::Module& model, torch::optim::Optimizer& opt, const std::string& dir) {
  return static_cast<int>(load_checkpoint(model, opt, dir, {{"step", 0}}).at("step").to_int());
}

void expect_equal_maps(const std::map<std::string, at::Tensor>& actual, const std::map<std::string, at::Tensor>& expected,
                       const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (const auto& [key, v] : expected) {
    auto it = actual.find(key);
    ASSERT_TRUE(it != actual.end()) << what << ": no '" << key << "'";
    EXPECT_TRUE(it->second.equal(v)) << what << ": '" << key << "' max abs diff "
                                     << (it->second - v).abs().max().item<double>();
  }
}

// The seed's sweep at (dp, tp) = 2 x 2: use_seq_parallel F/T x reuse_model_optim F/T x Adam /
// AdamW; then the checkpoint into a 1-D FSDP model over the world and into the plain model.
void check_resume(RankContext& ctx, bool use_seq_parallel, bool adamw) {
  const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
  const int dp = mesh.get_local_rank("dp");
  const std::string what = std::string(use_seq_parallel ? "SP " : "") + (adamw ? "AdamW" : "Adam");
  const std::string dir = ctx.temp_dir + "/ckpt_" + std::string(use_seq_parallel ? "sp_" : "") + (adamw ? "AdamW" : "Adam");

  auto model = make_2d(mesh, 0, use_seq_parallel);
  auto opt = make_optimizer(*model, adamw, 1e-2);
  std::vector<float> uninterrupted;
  std::map<std::string, at::Tensor> saved_params, saved_optim;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSaveAt) {
      save(*model, *opt, dir);
      saved_params = full_values(*model);
      saved_optim = full_optimizer_values(*model, *opt);
    }
    uninterrupted.push_back(train_step(*model, *opt, step, dp, 2));
  }
  const auto final_params = full_values(*model);

  for (bool reuse : {false, true}) {
    const std::string label = what + (reuse ? " reused" : " fresh");
    std::shared_ptr<torch::nn::Module> resumed = reuse ? model : make_2d(mesh, 1, use_seq_parallel);
    std::unique_ptr<torch::optim::Optimizer> fresh_opt = reuse ? nullptr : make_optimizer(*resumed, adamw, 0.5);
    torch::optim::Optimizer& resumed_opt = reuse ? *opt : *fresh_opt;
    if (!reuse) {
      ASSERT_FALSE(full_values(*resumed).at("output.weight").equal(saved_params.at("output.weight")));
    }
    ASSERT_EQ(load(*resumed, resumed_opt, dir), kSaveAt) << label;
    EXPECT_DOUBLE_EQ(resumed_opt.param_groups()[0].options().get_lr(), 1e-2) << label;
    expect_equal_maps(full_values(*resumed), saved_params, label + " params at the checkpoint");
    expect_equal_maps(full_optimizer_values(*resumed, resumed_opt), saved_optim, label + " optimizer at the checkpoint");
    for (int step = kSaveAt; step < kSteps; ++step)
      EXPECT_EQ(train_step(*resumed, resumed_opt, step, dp, 2), uninterrupted[step]) << label << " step " << step;
    expect_equal_maps(full_values(*resumed), final_params, label + " params at the end");
    if (::testing::Test::HasFailure()) return;
  }

  // Other layouts: 1-D FSDP over the world, and the plain model on every rank. They hold the
  // checkpoint's values exactly, then train on at parity within float32 tolerance (gradients
  // summed in another order; TP's partial sums).
  for (bool one_d : {true, false}) {
    const std::string label = what + (one_d ? " onto 1-D FSDP" : " onto the plain model");
    auto other = make_plain_or_1d(one_d ? ctx.world : ProcessGroup(), 2);
    auto other_opt = make_optimizer(*other, adamw, 0.5);
    ASSERT_EQ(load(*other, *other_opt, dir), kSaveAt) << label;
    expect_equal_maps(full_values(*other), saved_params, label + " params at the checkpoint");
    expect_equal_maps(full_optimizer_values(*other, *other_opt), saved_optim, label + " optimizer at the checkpoint");
    // Each layout's batch parts average to the global batch's gradient.
    for (int step = kSaveAt; step < kSteps; ++step)
      train_step(*other, *other_opt, step, one_d ? ctx.rank : 0, one_d ? ctx.world_size : 1);
    for (const auto& [key, v] : full_values(*other))
      EXPECT_TRUE(at::allclose(v, final_params.at(key), kRtol, kAtol))
          << label << ": '" << key << "' max abs diff " << (v - final_params.at(key)).abs().max().item<double>();
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(FullyShard2DTraining, TrainParity2DTransformerCheckpointResume) {
  run_ranks(4, [](RankContext& ctx) {
    for (bool use_seq_parallel : {false, true})
      for (bool adamw : {false, true}) {
        check_resume(ctx, use_seq_parallel, adamw);
        if (::testing::Test::HasFailure()) return;
      }
  });
}

// clip_grad_norm_ of the 2-D transformer: the total norm over every rank's gradient blocks (TP
// parts summed over dp x tp, the replicated norms and biases counted once) equals the plain
// model's on the global batch (libtorch's clip_grad_norm_), norm types 2 and inf, with a
// max_norm that clips; SGD after clipping keeps the two at parity. With sequence parallelism the
// norms' gradients are identical on the tp ranks only after their all-reduce in backward, which
// clip_grad_norm_ relies on (it counts a TP Replicate gradient once).
TEST(FullyShard2DTraining, ClipGradNorm2DTransformer) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    const int dp = mesh.get_local_rank("dp");
    const double inf = std::numeric_limits<double>::infinity();
    for (const auto& sweep : std::vector<std::pair<bool, double>>{{false, 2.0}, {false, inf}, {true, 2.0}, {true, inf}}) {
      const bool use_seq_parallel = sweep.first;
      const double norm_type = sweep.second;
      const std::string label = std::string(use_seq_parallel ? "SP " : "") + "norm_type " + std::to_string(norm_type);
      auto model = make_2d(mesh, 0, use_seq_parallel);
      auto plain = make_plain_or_1d(ProcessGroup(), 1);
      set_model_state_dict(*plain, get_model_state_dict(*model, StateDictOptions().full_state_dict(true)));
      torch::optim::SGD opt(model->parameters(), 0.1), plain_opt(plain->parameters(), 0.1);
      const double max_norm = norm_type == 2.0 ? 0.5 : 0.05;
      for (int step = 0; step < 3; ++step) {
        double norm = 0, plain_norm = 0;
        train_step(*model, opt, step, dp, 2, [&] { norm = clip_grad_norm_(*model, max_norm, norm_type).item<double>(); });
        train_step(*plain, plain_opt, step, 0, 1, [&] {
          plain_norm = torch::nn::utils::clip_grad_norm_(plain->parameters(), max_norm, norm_type);
        });
        ASSERT_GT(plain_norm, max_norm) << label << " step " << step << ": the test must clip";
        EXPECT_NEAR(norm, plain_norm, 1e-6 * plain_norm) << label << " step " << step;
      }
      const auto params = full_values(*model);
      for (const auto& [key, v] : full_values(*plain))
        EXPECT_TRUE(at::allclose(params.at(key), v, kRtol, kAtol))
            << label << ": '" << key << "' max abs diff " << (params.at(key) - v).abs().max().item<double>();
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// export_safetensors of the 2-D transformer: one standard file (rank 0 writes, each 2-D block
// gathered to it) holding the plain model's keys and exactly the FULL state dict's values, with
// and without sequence parallelism (whose norms are TP-replicated parameters).
TEST(FullyShard2DTraining, ExportSafetensors2DTransformer) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    for (bool use_seq_parallel : {false, true}) {
      const std::string what = use_seq_parallel ? "SP" : "no SP";
      auto model = make_2d(mesh, 0, use_seq_parallel);
      auto opt = make_optimizer(*model, false, 1e-2);
      train_step(*model, *opt, 0, mesh.get_local_rank("dp"), 2);  // values no rank had at initialization
      const std::string file = ctx.temp_dir + "/model" + (use_seq_parallel ? "_sp" : "") + ".safetensors";
      ckpt::export_safetensors(*model, file);
      const auto expected = full_values(*model);
      if (ctx.rank == 0) expect_equal_maps(ckpt::load_safetensors(file), expected, what + ": the exported file");
      if (::testing::Test::HasFailure()) return;
    }
  });
}

// A 2-D checkpoint loaded into a model of another architecture: errors name the key and both
// shapes (a wider model), or a key the checkpoint lacks (a deeper one), and change nothing.
TEST(FullyShard2DTraining, CheckpointIntoAnotherArchitectureIsRefused) {
  run_ranks(4, [](RankContext& ctx) {
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    auto model = make_2d(mesh, 0, /*use_seq_parallel=*/false);
    auto opt = make_optimizer(*model, false, 1e-2);
    const std::string dir = ctx.temp_dir + "/ckpt";
    save(*model, *opt, dir);
    TransformerArgs wider = tiny_args(), deeper = tiny_args();
    wider.dim = 32;
    deeper.n_layers = 3;
    for (const TransformerArgs& args : {wider, deeper}) {
      auto other = make_plain_or_1d(ProcessGroup(), 2, args);
      StateDict sd = get_model_state_dict(*other);
      const at::Tensor before = sd.at("tok_embeddings.weight").tensor().clone();
      ckpt::State state = ckpt::to_state(sd, "model.");
      const std::string error = testing::error_of([&] { ckpt::load(state, dir); });
      if (args.dim != tiny_args().dim) {
        // The first mismatch in key order.
        EXPECT_NE(error.find("tensor 'model.layers.0.attention.wk.weight' is F32 [16, 16] there but F32 [32, 32] in the "
                             "state to load"),
                  std::string::npos)
            << error;
      } else {
        EXPECT_NE(error.find("model.layers.2."), std::string::npos) << error;
      }
      EXPECT_TRUE(sd.at("tok_embeddings.weight").tensor().equal(before));
    }
  });
}

}  // namespace
}  // namespace fsdpp

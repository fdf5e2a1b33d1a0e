// Sharded state of 2-D (FSDP x TP) models whose (dp, tp) mesh is a slice of the world (issue 13):
// each pipeline stage of a (pp, dp, tp) mesh, and each replica of HSDP x TP (fully_shard over a
// (replicate, shard) mesh of TP parts). A 2-D parameter's SHARDED value lies over the group of its
// slice's dp x tp ranks (under HSDP: one replica's shard x tp ranks; the replicas hold the same
// blocks). A distributed checkpoint of the SHARDED model and optimizer state dicts saved mid-run
// resumes onto a fresh model bitwise equal to the uninterrupted run, and loads into the plain
// model exactly. clip_grad_norm_ over a slice returns the plain model's total norm, and the run
// keeps parity with it. At world size 4 (dp 1) and 8 (dp 2).
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fsdpp/checkpoint.h>
#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/state_dict.h>

#include "dist/fully_shard_2d_fixtures.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;

constexpr int64_t kDim = 17;  // uneven TP and FSDP shards
constexpr int kSaveAt = 2, kSteps = 4;
constexpr double kMaxNorm = 0.5;
// Parameters against the plain model's after kSteps clipped Adam steps: float32 sums in another
// order. Measured (libtorch 1.13): max abs difference 1.2e-6 (1.out_proj.weight, pp 2 x dp 1 x tp 2).
constexpr double kPlainParamAtol = 4e-6;

// The input of (step, part): slices (pp stages) or replicas train on different data.
at::Tensor input(int step, int part) {
  torch::manual_seed(1000 + 10 * step + part);
  return torch::randn({4, kDim});
}

// Squared distance to 1: a sum of the stack's ReLU outputs has them all at 0 within two Adam
// steps, and zero gradients from then on.
at::Tensor loss_of(const at::Tensor& output) { return (output - 1).pow(2).sum(); }

// One step on the input of (step, part); clip_grad_norm_'s total norm.
double train_step(FSDPSequential& model, torch::optim::Optimizer& opt, int step, int part) {
  opt.zero_grad();
  loss_of(model->forward(input(step, part))).backward();
  // Over the slice's dp x tp group (a world-wide one would hang or mix slices).
  const double norm = clip_grad_norm_(*model, kMaxNorm).item<double>();
  opt.step();
  return norm;
}

// The plain model's step on the mean loss of the inputs of `parts` (the 2-D model's gradient is
// averaged over its dp ranks, whose replicas see different parts); libtorch's total norm.
double plain_step(Sequential& plain, torch::optim::Optimizer& opt, int step, const std::vector<int>& parts) {
  opt.zero_grad();
  at::Tensor loss = torch::zeros({});
  for (int part : parts) loss = loss + loss_of(plain->forward(input(step, part)));
  (loss / static_cast<double>(parts.size())).backward();
  const double norm = torch::nn::utils::clip_grad_norm_(plain->parameters(), kMaxNorm);
  opt.step();
  return norm;
}

std::map<std::string, at::Tensor> full_optimizer_values(FSDPSequential& model, const torch::optim::Optimizer& opt) {
  std::map<std::string, at::Tensor> out;
  const OptimizerStateDict osd = get_optimizer_state_dict(*model, opt, StateDictOptions().full_state_dict(true));
  for (const auto& [key, v] : flatten_optimizer_state(osd)) out[key] = v.tensor();
  return out;
}

void save(FSDPSequential& model, const torch::optim::Optimizer& opt, const std::string& dir, const ProcessGroup& group) {
  ckpt::State state = ckpt::to_state(get_model_state_dict(model), "model.");
  state.merge(ckpt::to_state(get_optimizer_state_dict(*model, opt), "optim."));
  ckpt::save(state, dir, ckpt::SaveOptions().process_group(group));
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

// The 2-D model over `dp_mesh` (1-D: FSDP; 2-D: HSDP) and `tp_mesh` trains kSteps on input part
// `part`, saving at kSaveAt into `dir` (saved by `save_group`); a fresh model and optimizer load
// the checkpoint and train on, bitwise equal to the uninterrupted run; the plain model loads the
// saved values exactly. `mesh_ranks`: the ranks of this rank's dp x tp slice. The uninterrupted
// run's clip_grad_norm_ totals and final parameters match the plain model trained on the mean
// loss of `plain_parts` (the parts whose gradients the slice averages).
void check_resume(const DeviceMesh& dp_mesh, const DeviceMesh& tp_mesh, int part, const std::vector<int>& plain_parts,
                  const ProcessGroup& save_group, const std::string& dir, std::vector<int> mesh_ranks,
                  const std::string& label) {
  const Case2D c{true, false, kDim};
  FSDPSequential model = make_2d(kDim, dp_mesh, tp_mesh, c);
  torch::optim::Adam opt(model->parameters(), 1e-2);
  Sequential reference = make_mlp_stack(kDim);
  torch::optim::Adam reference_opt(reference->parameters(), 1e-2);
  std::map<std::string, at::Tensor> saved_params, saved_optim;
  for (int step = 0; step < kSteps; ++step) {
    if (step == kSaveAt) {
      // The SHARDED dicts: a TP Shard parameter's blocks over exactly this slice's dp x tp ranks.
      const StateDict sd = get_model_state_dict(model);
      const ShardedTensor& w = sd.at("0.in_proj.weight").sharded_tensor();
      std::sort(mesh_ranks.begin(), mesh_ranks.end());
      EXPECT_EQ(w.process_group().ranks(), mesh_ranks) << label;
      EXPECT_EQ(w.size(), (std::vector<int64_t>{3 * kDim, kDim})) << label;
      save(model, opt, dir, save_group);
      saved_params = global_params(*model);
      saved_optim = full_optimizer_values(model, opt);
    }
    const double norm = train_step(model, opt, step, part);
    const double plain_norm = plain_step(reference, reference_opt, step, plain_parts);
    ASSERT_GT(plain_norm, kMaxNorm) << label << " step " << step << ": the test must clip";
    EXPECT_NEAR(norm, plain_norm, 1e-6 * plain_norm) << label << " step " << step << ": the total norm";
  }
  expect_global_params_close(*model, *reference, label + " against the plain model", 1, kPlainParamAtol);
  const auto final_params = global_params(*model);
  const auto final_optim = full_optimizer_values(model, opt);

  FSDPSequential resumed = make_2d(kDim, dp_mesh, tp_mesh, c);
  torch::optim::Adam resumed_opt(resumed->parameters(), 0.5);
  ASSERT_FALSE(global_params(*resumed).at("0.in_proj.weight").equal(saved_params.at("0.in_proj.weight"))) << label;
  load_checkpoint(*resumed, resumed_opt, dir);
  EXPECT_DOUBLE_EQ(resumed_opt.param_groups()[0].options().get_lr(), 1e-2) << label;
  expect_equal_maps(global_params(*resumed), saved_params, label + " params at the checkpoint");
  expect_equal_maps(full_optimizer_values(resumed, resumed_opt), saved_optim, label + " optimizer at the checkpoint");
  for (int step = kSaveAt; step < kSteps; ++step) train_step(resumed, resumed_opt, step, part);
  expect_equal_maps(global_params(*resumed), final_params, label + " params at the end");
  expect_equal_maps(full_optimizer_values(resumed, resumed_opt), final_optim, label + " optimizer at the end");

  // The plain model (whole tensors) takes the saved global values exactly.
  Sequential plain = make_mlp_stack(kDim);
  StateDict plain_sd = get_model_state_dict(plain);
  ckpt::State state = ckpt::to_state(plain_sd, "model.");
  ckpt::load(state, dir);
  set_model_state_dict(plain, plain_sd);
  std::map<std::string, at::Tensor> plain_params;
  for (const auto& item : plain->named_parameters()) plain_params[item.key()] = item.value().detach();
  expect_equal_maps(plain_params, saved_params, label + " plain model");
}

// Seed 001's 3-D mesh with pp = 2: each stage's 2-D model (the stage's dp x tp ranks) trains on its
// own data and checkpoints on its own; state-dict calls are made by one stage's ranks only.
void check_pipeline_stages(RankContext& ctx, int dp_size, int tp_size) {
  const DeviceMesh mesh = init_device_mesh(ctx.world, {2, dp_size, tp_size}, {"pp", "dp", "tp"});
  const int pp = mesh.get_local_rank("pp"), per_stage = dp_size * tp_size;
  ProcessGroup stage;
  for (int s = 0; s < 2; ++s) {  // every rank makes both stages' groups, in the same order
    std::vector<int> ranks;
    for (int r = 0; r < per_stage; ++r) ranks.push_back(s * per_stage + r);
    ProcessGroup g = ctx.world.new_group(ranks);
    if (s == pp) stage = g;
  }
  check_resume(mesh["dp"], mesh["tp"], pp, {pp}, stage, ctx.temp_dir + "/stage" + std::to_string(pp), stage.ranks(),
               "stage " + std::to_string(pp));
}

// HSDP x TP: each replica's blocks over its own shard x tp ranks; the replicas (which train on
// different data and all-reduce) save one checkpoint over the world, each block written once.
void check_hsdp_times_tp(RankContext& ctx, int shard_size, int tp_size) {
  const DeviceMesh mesh = init_device_mesh(ctx.world, {2, shard_size, tp_size}, {"replicate", "shard", "tp"});
  const int replica = mesh.get_local_rank("replicate"), per_replica = shard_size * tp_size;
  const std::string dir = ctx.temp_dir + "/hsdp_tp";
  std::vector<int> ranks;
  for (int r = 0; r < per_replica; ++r) ranks.push_back(replica * per_replica + r);
  check_resume(mesh[std::vector<std::string>{"replicate", "shard"}], mesh["tp"], replica, {0, 1}, ctx.world, dir, ranks,
               "replica " + std::to_string(replica));
  // Each block once: a tensor's chunks tile it without repeats.
  const ckpt::Metadata metadata = ckpt::read_metadata(dir);
  for (const auto& [key, info] : metadata.entries) {
    if (info.kind != ckpt::Entry::Kind::kTensor) continue;
    int64_t numel = 1, chunked = 0;
    for (int64_t s : info.shape) numel *= s;
    for (const auto& chunk : info.chunks) {
      int64_t n = 1;
      for (int64_t s : chunk.sizes) n *= s;
      chunked += n;
    }
    EXPECT_EQ(chunked, numel) << key;
  }
}

// At world size 4: (pp, dp, tp) = 2 x 1 x 2.
TEST(FullyShard2DSubmeshState, PipelineStagesCheckpointAndResume) {
  run_ranks(4, [](RankContext& ctx) { check_pipeline_stages(ctx, 1, 2); });
}

// At world size 4: (replicate, shard, tp) = 2 x 1 x 2.
TEST(FullyShard2DSubmeshState, HsdpTimesTpCheckpointAndResume) {
  run_ranks(4, [](RankContext& ctx) { check_hsdp_times_tp(ctx, 1, 2); });
}

// The seed's 8-GPU mesh, 2 x 2 x 2: FSDP over 2 ranks in each slice (the mesh learnt by a real
// all-gather over dp).
TEST(FullyShard2DSubmeshState, PipelineStages2x2x2) {
  run_ranks(8, [](RankContext& ctx) { check_pipeline_stages(ctx, 2, 2); });
}

TEST(FullyShard2DSubmeshState, HsdpTimesTp2x2x2) {
  run_ranks(8, [](RankContext& ctx) { check_hsdp_times_tp(ctx, 2, 2); });
}

}  // namespace
}  // namespace fsdpp

#pragma once
// What the FSDP x TP tests share (seed 001's TestFullyShard2DTraining in test_fully_shard_2d.cpp,
// TestFullyShardNDTraining in test_fully_shard_nd.cpp): the seed's MLPStack cut by
// parallelize_module over a "tp" mesh, then every MLP and the root fully_shard over a "dp" mesh;
// a parameter's global value (its FSDP gather over dp, gathered again by its TP layout over tp);
// and the seed's training loop against DDP of the plain model over the dp group.
#include <functional>
#include <initializer_list>
#include <map>
#include <string>

#include <fsdpp/activation_checkpointing.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/fully_shard_options.h>
#include <fsdpp/tensor_parallel.h>

#include "dist/fsdp_test_util.h"

namespace fsdpp {

// Float32 sums over the same values in another order (DDP's average vs FSDP's reduce-scatter,
// TP's partial sums). Measured over every test using them (FullyShard2DTraining.TrainParity2DMlp*
// and TpWithFsdpOffloading*, FullyShardNDTraining.*; libtorch 1.13): max abs difference 4.8e-7
// in the losses (values up to 4.5) and 2.1e-7 in the parameters (up to 0.61); the gradients
// (values up to 8; TrainParity2DMlp* and FullyShardNDTraining.*, libtorch 2.15) 2.4e-7. The bounds
// leave about 4x. rtol is float32 assertEqual's default.
inline constexpr double kLossRtol = 1.3e-6, kLossAtol = 2e-6;
inline constexpr double kParamRtol = 1.3e-6, kParamAtol = 1e-6;
inline constexpr double kGradRtol = 1.3e-6, kGradAtol = 1e-6;

struct Case2D {
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  int64_t mlp_dim = 16;
  bool cpu_offload = false;  // CPUOffloadPolicy() on every unit
  at::Device device = at::kCPU;  // where both models compute (tests/gpu: a CUDA device)
  double tolerance_scale = 1;     // times the bounds above (measured on the CPU)
};

inline std::string describe(const Case2D& c) {
  return "reshard_after_forward " + std::to_string(c.reshard_after_forward) + " ac " +
         std::to_string(c.activation_checkpointing) + " mlp_dim " + std::to_string(c.mlp_dim) +
         (c.cpu_offload ? " cpu_offload" : "") + (c.device.is_cpu() ? "" : " on " + c.device.str());
}

// PyTorch's MLPStack (common_fsdp.py) without sequence parallelism: hidden sizes 3x, 4x, 3x
// (3x exercises uneven TP and FSDP shards), a relu after each Linear.
inline Sequential make_mlp_stack(int64_t dim) {
  torch::manual_seed(42);
  return Sequential(MLP(dim, 3 * dim, true), MLP(dim, 4 * dim, true), MLP(dim, 3 * dim, true));
}

// MLPStack.parallelize's TP plan: in_proj column-wise and out_proj row-wise.
inline ParallelizePlan mlp_stack_plan(size_t mlps) {
  ParallelizePlan plan;
  for (size_t i = 0; i < mlps; ++i) {
    plan.emplace_back(std::to_string(i) + ".in_proj", ColwiseParallel());
    plan.emplace_back(std::to_string(i) + ".out_proj", RowwiseParallel());
  }
  return plan;
}

// MLPStack.parallelize(tp_mesh, dp_mesh, ...): the TP plan over `tp_mesh`, then each MLP
// (checkpointed first when asked) and the root fully_shard over `dp_mesh` (1-D sub-meshes of
// whatever mesh the test built).
inline FSDPSequential make_2d(int64_t dim, const DeviceMesh& dp_mesh, const DeviceMesh& tp_mesh, const Case2D& c) {
  Sequential stack = make_mlp_stack(dim);
  stack->to(c.device);
  parallelize_module(*stack, tp_mesh, mlp_stack_plan(stack->size()));
  auto options = FullyShardOptions().mesh(dp_mesh).reshard_after_forward(c.reshard_after_forward);
  if (c.cpu_offload) options.offload_policy(CPUOffloadPolicy());
  Sequential seq;
  for (size_t i = 0; i < stack->size(); ++i) {
    auto mlp = stack->ptr<MLPImpl>(i);
    if (c.activation_checkpointing)
      seq->push_back(fully_shard(checkpoint_wrapper(mlp), options));
    else
      seq->push_back(fully_shard(mlp, options));
  }
  return FSDPSequential(seq, options);
}

// A parameter's FQN in the plain model: without the FSDP and checkpoint wrappers' segments.
inline std::string plain_name(const std::string& name) {
  std::string key = strip_wrapper_prefixes(name);
  const std::string checkpoint = "_checkpoint_wrapped_module.";
  for (size_t pos; (pos = key.find(checkpoint)) != std::string::npos;) key.erase(pos, checkpoint.size());
  return key;
}

// Every parameter's global value: gathered over dp by FSDP (summon_full_params), then over tp by
// its TP layout. Keys are the plain model's.
inline std::map<std::string, at::Tensor> global_params(torch::nn::Module& model) {
  std::map<const c10::TensorImpl*, TensorLayout> tp_layouts;
  for (const auto& p : tensor_parallel_parameters(model)) tp_layouts.emplace(p.param.unsafeGetTensorImpl(), p.layout);
  std::map<std::string, at::Tensor> out;
  auto full = summon_full_params(model, /*writeback=*/false);
  for (const auto& item : model.named_parameters()) {
    at::Tensor local_full = item.value().detach().clone();
    auto it = tp_layouts.find(item.value().unsafeGetTensorImpl());
    out[plain_name(item.key())] =
        it == tp_layouts.end() ? local_full
                               : it->second.to_sharded_tensor(local_full.contiguous(), /*copy=*/true).full_tensor();
  }
  return out;
}

inline void expect_same(const at::Tensor& actual, const at::Tensor& expected, double rtol, double atol,
                        const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  EXPECT_TRUE(at::allclose(actual, expected, rtol, atol))
      << what << ": max abs diff " << (actual - expected).abs().max().item<double>();
}

// Every parameter's global gradient: this rank's gradient shard gathered over dp by its FSDP
// layout (Shard(0) of the TP-local part), then over tp by its TP layout. Keys are the plain
// model's. Collective over both groups (every rank walks the parameters in the same order); a
// missing gradient is a failure, and zeros stand in for it so the other ranks are not left waiting.
inline std::map<std::string, at::Tensor> global_grads(torch::nn::Module& model) {
  std::map<const c10::TensorImpl*, TensorLayout> tp_layouts, dp_layouts;
  for (const auto& p : tensor_parallel_parameters(model)) tp_layouts.emplace(p.param.unsafeGetTensorImpl(), p.layout);
  for (FSDPModule* unit : fsdp_units(model))
    for (const auto& s : unit->sharded_parameters()) dp_layouts.emplace(s.param.unsafeGetTensorImpl(), s.layout);
  std::map<std::string, at::Tensor> out;
  for (const auto& item : model.named_parameters()) {
    const std::string key = plain_name(item.key());
    at::Tensor grad = item.value().grad();
    if (!grad.defined()) {
      ADD_FAILURE() << key << " has no gradient";
      grad = at::zeros_like(item.value());
    }
    grad = grad.detach().contiguous();
    auto dp = dp_layouts.find(item.value().unsafeGetTensorImpl());
    if (dp != dp_layouts.end()) grad = dp->second.to_sharded_tensor(grad, /*copy=*/true).full_tensor();
    auto tp = tp_layouts.find(item.value().unsafeGetTensorImpl());
    if (tp != tp_layouts.end()) grad = tp->second.to_sharded_tensor(grad.contiguous(), /*copy=*/true).full_tensor();
    out[key] = grad;
  }
  return out;
}

// Each of the reference's parameters, `of` it (its value or its `.grad`), against the 2-D model's
// global one in `global` (keys: the plain model's); `what` names which ("param", "grad").
inline void expect_global_close(const std::map<std::string, at::Tensor>& global, torch::nn::Module& ref,
                                const std::function<at::Tensor(const at::Tensor&)>& of, const std::string& what,
                                double rtol, double atol, const std::string& label) {
  const auto ref_named = ref.named_parameters();
  ASSERT_EQ(global.size(), ref_named.size()) << label;
  for (const auto& item : ref_named) {
    auto it = global.find(item.key());
    ASSERT_TRUE(it != global.end()) << label << ": no " << what << " " << item.key();
    expect_same(it->second, of(item.value()), rtol, atol, label + " " + what + " " + item.key());
  }
}

// Every global parameter of the 2-D model against the plain reference's.
inline void expect_global_params_close(torch::nn::Module& model, torch::nn::Module& ref, const std::string& label,
                                       double tolerance_scale = 1, double atol = kParamAtol) {
  expect_global_close(global_params(model), ref, [](const at::Tensor& p) { return p.detach(); }, "param",
                      tolerance_scale * kParamRtol, tolerance_scale * atol, label);
}

// Every global gradient of the 2-D model (global_grads: collective) against the plain
// reference's `.grad`.
inline void expect_global_grads_close(torch::nn::Module& model, torch::nn::Module& ref, const std::string& label,
                                      double tolerance_scale = 1) {
  expect_global_close(global_grads(model), ref, [](const at::Tensor& p) { return p.grad(); }, "grad",
                      tolerance_scale * kGradRtol, tolerance_scale * kGradAtol, label);
}

// The seeds' loop (_test_train_parity_2d_mlp, _test_2d_mlp_with_nd_mesh): DDP over the dp group
// (the reference, the plain model) and the 2-D model on the same input on every tp rank of a dp
// rank, Adam(1e-2), 10 steps, zero_grad alternating set_to_none. Losses every step, every global
// parameter at the end, as the seeds; beyond them, every global gradient every step, after
// backward and before the step, against DDP's (which averages over dp). The seeds' checks alone
// cannot tell an average over dp from a sum: Adam's step barely changes when every gradient is
// scaled by the same factor, so the losses and parameters stay within their bounds. The inputs are
// seeded by the dp rank, plus `input_seed` (0 in the seeds). The trained 2-D model goes to
// `trained` when given.
inline void check_2d_parity(const DeviceMesh& dp_mesh, const DeviceMesh& tp_mesh, const Case2D& c,
                            int input_seed = 0, FSDPSequential* trained = nullptr) {
  const std::string label = describe(c);
  Sequential ref_module = make_mlp_stack(c.mlp_dim);
  ref_module->to(c.device);
  auto ref = replicate(ref_module, DistributedDataParallelOptions().process_group(dp_mesh.get_group()));
  FSDPSequential model = make_2d(c.mlp_dim, dp_mesh, tp_mesh, c);
  if (trained) *trained = model;
  torch::optim::Adam ref_opt(ref_module->parameters(), 1e-2), opt(model->parameters(), 1e-2);
  torch::manual_seed(42 + input_seed + dp_mesh.get_local_rank(0) + 1);
  for (int iter = 0; iter < 10; ++iter) {
    for (auto* o : std::initializer_list<torch::optim::Optimizer*>{&ref_opt, &opt}) {
      if (iter % 2 == 0) {
        for (auto& p : o->parameters()) p.mutable_grad().reset();
      } else {
        o->zero_grad();
      }
    }
    const std::string where = label + " iter " + std::to_string(iter);
    at::Tensor x = torch::randn({8, c.mlp_dim}).to(c.device);
    at::Tensor ref_loss = ref.forward(x).sum();
    ref_loss.backward();
    at::Tensor loss = model->forward(x).sum();
    loss.backward();
    expect_global_grads_close(*model, *ref_module, where, c.tolerance_scale);
    ref_opt.step();
    opt.step();
    expect_same(loss.detach(), ref_loss.detach(), c.tolerance_scale * kLossRtol, c.tolerance_scale * kLossAtol,
                where + " loss");
    if (::testing::Test::HasFailure()) return;
  }
  expect_global_params_close(*model, *ref_module, label, c.tolerance_scale);
}

}  // namespace fsdpp

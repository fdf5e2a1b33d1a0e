#pragma once
// Tensor parallelism (PyTorch's torch.distributed.tensor.parallel): a Linear's or Embedding's
// weight split across a TP group, its inputs and outputs redistributed as PyTorch's
// ColwiseParallel / RowwiseParallel styles do.
//
//   torch::manual_seed(0);                        // the same full model on every TP rank
//   torch::nn::Sequential mlp(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 16));
//   fsdpp::parallelize_module(*mlp, tp_group, {{"0", fsdpp::ColwiseParallel()},
//                                              {"2", fsdpp::RowwiseParallel()}});
//   auto y = mlp->forward(x);                     // x and y replicated (the same on every TP rank)
//
// libtorch has no forward hooks, so a parallelized module runs inside a wrapper,
// fsdpp::TensorParallel<M> (M = torch::nn::LinearImpl or EmbeddingImpl). parallelize_module puts
// it in place of a plain Linear/Embedding held by a Sequential or ModuleList; a module its parent
// calls through a typed member must already be declared as the wrapper (a plain typed member is an
// error naming it):
//   fsdpp::TensorParallel<torch::nn::LinearImpl> fc1{nullptr};
//   fc1 = register_module("fc1", fsdpp::TensorParallel<torch::nn::LinearImpl>(torch::nn::Linear(16, 64)));
// Until parallelized, the wrapper is its module. The wrapper registers the module's parameters
// under their own names, so parameter FQNs are the plain model's ("fc1.weight", "0.bias").
//
// Sharding follows torch.chunk (TensorLayout): rank r holds ceil(n / size) slices, the last ranks
// fewer or none, so no size needs to divide. parallelize_module cuts each rank's part out of the
// full parameter it has (no communication): every rank must hold the same full model.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/device_mesh.h>
#include <fsdpp/process_group.h>
#include <fsdpp/tensor_layout.h>

namespace fsdpp {

// How an activation (a module's input or output) lies across the TP group. PyTorch's
// Replicate() and Shard(-1); there is no DTensor here, so a module always takes and returns
// the local tensor (PyTorch's use_local_output=True).
enum class TPLayout { Replicate, ShardLastDim };

// Linear: weight and bias Shard(0) (out features); Embedding: weight Shard(1) (embedding dim).
// Input Replicate (its gradient is all-reduced); output Shard(-1), or Replicate (all-gathered).
struct ColwiseParallel {
  ColwiseParallel& output_layouts(TPLayout v) { output_layouts_ = v; return *this; }
  TPLayout output_layouts_ = TPLayout::ShardLastDim;
};

// Linear: weight Shard(1) (in features), bias Replicate, added once after the all-reduce;
// input Shard(-1) (a Replicate input is cut locally, its gradient all-gathered).
// Embedding: weight Shard(0) (rows), each rank looks up the ids it holds, zeros elsewhere.
// Output: the partial sums all-reduced, Replicate.
struct RowwiseParallel {
  RowwiseParallel& input_layouts(TPLayout v) { input_layouts_ = v; return *this; }
  TPLayout input_layouts_ = TPLayout::ShardLastDim;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel>;
// Module FQNs (as named_modules() names them, e.g. "0", "layers.1.fc1") to their styles.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// One parameter of a parallelized module (PyTorch's DTensor: its layout travels beside it).
struct TensorParallelParameter {
  std::string name;    // relative to the module ("weight", "bias")
  at::Tensor param;    // the module's parameter: this rank's part
  TensorLayout layout; // global shape and placement over the TP group
};

// The untyped part of every TensorParallel<M>.
class TensorParallelModule : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& input);

  const std::shared_ptr<torch::nn::Module>& wrapped_module() const { return module_; }
  bool is_parallelized() const { return style_.has_value(); }
  const std::optional<ParallelStyle>& style() const { return style_; }
  const ProcessGroup& process_group() const { return group_; }
  // The parameters with their layouts (empty until parallelized).
  const std::vector<TensorParallelParameter>& tp_parameters() const { return params_; }

  // Shards the parameters in place and applies `style` to forward (what parallelize_module
  // calls; `fqn` names the module in errors). Once only.
  void parallelize(const ParallelStyle& style, const ProcessGroup& tp_group, const std::string& fqn);

 protected:
  explicit TensorParallelModule(std::shared_ptr<torch::nn::Module> module);

 private:
  at::Tensor linear_forward(const at::Tensor& input);
  at::Tensor embedding_forward(const at::Tensor& input);

  std::shared_ptr<torch::nn::Module> module_;
  torch::nn::LinearImpl* linear_ = nullptr;
  torch::nn::EmbeddingImpl* embedding_ = nullptr;
  std::optional<ParallelStyle> style_;
  ProcessGroup group_;
  std::string fqn_;
  std::vector<TensorParallelParameter> params_;
};

template <typename M>
class TensorParallelImpl : public TensorParallelModule {
  static_assert(std::is_same_v<M, torch::nn::LinearImpl> || std::is_same_v<M, torch::nn::EmbeddingImpl>,
                "fsdpp::TensorParallel: only torch::nn::Linear and torch::nn::Embedding are supported");

 public:
  explicit TensorParallelImpl(std::shared_ptr<M> module) : TensorParallelModule(module), typed_(std::move(module)) {}
  explicit TensorParallelImpl(torch::nn::ModuleHolder<M> module) : TensorParallelImpl(module.ptr()) {}

  using TensorParallelModule::forward;
  const std::shared_ptr<M>& module() const { return typed_; }

 private:
  std::shared_ptr<M> typed_;
};

// The module holder: fsdpp::TensorParallel<torch::nn::LinearImpl> fc(torch::nn::Linear(4, 8));
template <typename M>
class TensorParallel : public torch::nn::ModuleHolder<TensorParallelImpl<M>> {
 public:
  using torch::nn::ModuleHolder<TensorParallelImpl<M>>::ModuleHolder;
};

template <typename M>
TensorParallel(torch::nn::ModuleHolder<M>) -> TensorParallel<M>;
template <typename M>
TensorParallel(std::shared_ptr<M>) -> TensorParallel<M>;

// Applies `plan` to the submodules of `module` over the TP group (or a 1-D mesh). Every rank of
// the group calls it with the same plan on the same full model. Checks the whole plan before it
// changes anything: an FQN that names no submodule, a module that is not a Linear/Embedding, a
// plain module its parent calls through a typed member, or one parallelized twice is an error
// naming the FQN.
void parallelize_module(torch::nn::Module& module, const ProcessGroup& tp_group, const ParallelizePlan& plan);
void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan);

// Every parallelized module's parameters below `module`, with FQNs relative to it.
std::vector<TensorParallelParameter> tensor_parallel_parameters(torch::nn::Module& module);

}  // namespace fsdpp

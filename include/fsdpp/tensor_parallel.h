#pragma once
// Tensor parallelism (PyTorch's torch.distributed.tensor.parallel): a Linear's or Embedding's
// weight split across a TP group, its inputs and outputs redistributed as PyTorch's
// ColwiseParallel / RowwiseParallel styles do; sequence parallelism (SequenceParallel on
// LayerNorms, Shard(1) activations between the matmuls, PrepareModuleInput).
//
//   torch::manual_seed(0);                        // the same full model on every TP rank
//   torch::nn::Sequential mlp(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 16));
//   fsdpp::parallelize_module(*mlp, tp_group, {{"0", fsdpp::ColwiseParallel()},
//                                              {"2", fsdpp::RowwiseParallel()}});
//   auto y = mlp->forward(x);                     // x and y replicated (the same on every TP rank)
//
// libtorch has no forward hooks, so a parallelized module runs inside a wrapper,
// fsdpp::TensorParallel<M> (M = torch::nn::LinearImpl, EmbeddingImpl, LayerNormImpl, or any
// module with a one-tensor forward for PrepareModuleInput). parallelize_module puts it in place of
// a plain Linear/Embedding/LayerNorm held by a Sequential or ModuleList; a module its parent calls
// through a typed member must already be declared as the wrapper (a plain typed member is an
// error naming it):
//   fsdpp::TensorParallel<torch::nn::LinearImpl> fc1{nullptr};
//   fc1 = register_module("fc1", fsdpp::TensorParallel<torch::nn::LinearImpl>(torch::nn::Linear(16, 64)));
// Until parallelized, the wrapper is its module. The wrapper registers the module's parameters,
// buffers and children under their own names, so FQNs are the plain model's ("fc1.weight").
//
// Sharding follows torch.chunk (TensorLayout): rank r holds ceil(n / size) slices, the last ranks
// fewer or none, so no size needs to divide (parameters, and sequence-sharded activations).
// parallelize_module cuts each rank's part out of the full parameter it has (no communication):
// every rank must hold the same full model.
#include <cstdint>
#include <functional>
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

namespace torch::nn {
class LayerNormImpl;
}  // namespace torch::nn

namespace fsdpp {

// How an activation (a module's input or output) lies across the TP group: PyTorch's Replicate()
// or Shard(dim), split along `dim` as torch.chunk splits it (negative dims count from the end).
// There is no DTensor here: a module always takes and returns the local tensor (PyTorch's
// use_local_output=True). A Replicate activation's gradient is replicated too (the same on every
// TP rank), as every style below keeps it.
class TPLayout {
 public:
  static constexpr TPLayout replicate() { return TPLayout(false, 0); }
  static constexpr TPLayout shard(int64_t dim) { return TPLayout(true, dim); }
  static const TPLayout Replicate;     // Replicate()
  static const TPLayout ShardLastDim;  // Shard(-1)

  constexpr bool is_replicate() const { return !shard_; }
  constexpr bool is_shard() const { return shard_; }
  constexpr int64_t dim() const { return dim_; }  // is_shard() only; may be negative
  // "Replicate()" / "Shard(1)", as PyTorch prints them.
  std::string to_string() const {
    return shard_ ? "Shard(" + std::to_string(dim_) + ")" : std::string("Replicate()");
  }
  constexpr bool operator==(const TPLayout& o) const { return shard_ == o.shard_ && (!shard_ || dim_ == o.dim_); }
  constexpr bool operator!=(const TPLayout& o) const { return !(*this == o); }

 private:
  constexpr TPLayout(bool shard, int64_t dim) : shard_(shard), dim_(dim) {}
  bool shard_;
  int64_t dim_;
};
inline constexpr TPLayout TPLayout::Replicate = TPLayout::replicate();
inline constexpr TPLayout TPLayout::ShardLastDim = TPLayout::shard(-1);

// Linear: weight and bias Shard(0) (out features); Embedding: weight Shard(1) (embedding dim).
// Input: Replicate (its gradient all-reduced), or Shard(d) (Linear only; PyTorch's
// input_layouts=Shard(1) of sequence parallelism): all-gathered along d before the matmul, its
// gradient reduce-scattered. Output: Shard(-1), or Replicate (all-gathered).
struct ColwiseParallel {
  ColwiseParallel& input_layouts(TPLayout v) { input_layouts_ = v; return *this; }
  ColwiseParallel& output_layouts(TPLayout v) { output_layouts_ = v; return *this; }
  TPLayout input_layouts_ = TPLayout::Replicate;
  TPLayout output_layouts_ = TPLayout::ShardLastDim;
};

// Linear: weight Shard(1) (in features), bias Replicate, added once after the reduction;
// input Shard(-1) (a Replicate input is cut locally, its gradient all-gathered).
// Embedding: weight Shard(0) (rows), each rank looks up the ids it holds, zeros elsewhere; the
// ids are replicated whatever input_layouts says.
// Output: the partial sums all-reduced, Replicate; or Shard(d) (PyTorch's output_layouts=Shard(1)
// of sequence parallelism): reduce-scattered along d (not the Linear's last dim), its gradient
// all-gathered; the bias's gradient is then all-reduced.
struct RowwiseParallel {
  RowwiseParallel& input_layouts(TPLayout v) { input_layouts_ = v; return *this; }
  RowwiseParallel& output_layouts(TPLayout v) { output_layouts_ = v; return *this; }
  TPLayout input_layouts_ = TPLayout::ShardLastDim;
  TPLayout output_layouts_ = TPLayout::Replicate;
};

// torch::nn::LayerNorm on a sequence-sharded activation (Shard(sequence_dim) in and out): it runs
// on the local rows; its weight and bias stay replicated and their gradients (partial on each TP
// rank) are all-reduced in backward, so they are the same on every TP rank.
struct SequenceParallel {
  SequenceParallel& sequence_dim(int64_t v) { sequence_dim_ = v; return *this; }
  int64_t sequence_dim_ = 1;
};

// Any module whose forward takes one tensor: redistributes its input from input_layouts to
// desired_input_layouts before the module runs (Shard(d) -> Replicate: all-gathered along d, its
// gradient cut back to this rank's part; Replicate -> Shard(d): cut, its gradient all-gathered).
struct PrepareModuleInput {
  PrepareModuleInput& input_layouts(TPLayout v) { input_layouts_ = v; return *this; }
  PrepareModuleInput& desired_input_layouts(TPLayout v) { desired_input_layouts_ = v; return *this; }
  TPLayout input_layouts_ = TPLayout::Replicate;
  TPLayout desired_input_layouts_ = TPLayout::Replicate;
};

using ParallelStyle = std::variant<ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput>;
// "RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))", as in errors.
std::string to_string(const ParallelStyle& style);
// Module FQNs (as named_modules() names them, e.g. "0", "layers.1.fc1") to their styles.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// One parameter of a parallelized module (PyTorch's DTensor: its layout travels beside it).
struct TensorParallelParameter {
  std::string name;    // relative to the module ("weight", "bias")
  at::Tensor param;    // the module's parameter: this rank's part
  TensorLayout layout; // global shape and placement over the TP group
};

// The untyped part of every TensorParallel<M>. The wrapper registers the wrapped module's
// parameters, buffers and children under their own names (FQNs stay the plain model's); until
// parallelized, its forward is the module's.
class TensorParallelModule : public torch::nn::Module {
 public:
  at::Tensor forward(const at::Tensor& input);

  const std::shared_ptr<torch::nn::Module>& wrapped_module() const { return module_; }
  bool is_parallelized() const { return style_.has_value(); }
  const std::optional<ParallelStyle>& style() const { return style_; }
  const ProcessGroup& process_group() const { return group_; }
  // The parameters with their layouts (empty until parallelized, and for PrepareModuleInput).
  const std::vector<TensorParallelParameter>& tp_parameters() const { return params_; }

  // Shards the parameters in place and applies `style` to forward (what parallelize_module
  // calls; `fqn` names the module in errors). Once only.
  void parallelize(const ParallelStyle& style, const ProcessGroup& tp_group, const std::string& fqn);

  // The wrapped module is not a child (its children are): train/eval reach it here.
  void train(bool on = true) override;

 protected:
  using ForwardFn = std::function<at::Tensor(const at::Tensor&)>;
  TensorParallelModule(std::shared_ptr<torch::nn::Module> module, ForwardFn forward);

 private:
  at::Tensor linear_forward(const at::Tensor& input);
  at::Tensor embedding_forward(const at::Tensor& input);
  at::Tensor layer_norm_forward(const at::Tensor& input);
  at::Tensor prepared_forward(const at::Tensor& input);
  std::string who() const;

  std::shared_ptr<torch::nn::Module> module_;
  ForwardFn forward_;
  torch::nn::LinearImpl* linear_ = nullptr;
  torch::nn::EmbeddingImpl* embedding_ = nullptr;
  torch::nn::LayerNormImpl* layer_norm_ = nullptr;
  std::optional<ParallelStyle> style_;
  ProcessGroup group_;
  std::string fqn_;
  std::vector<TensorParallelParameter> params_;
};

// M: torch::nn::LinearImpl or EmbeddingImpl (ColwiseParallel, RowwiseParallel), LayerNormImpl
// (SequenceParallel), or any module whose forward takes one tensor and returns one
// (PrepareModuleInput).
template <typename M>
class TensorParallelImpl : public TensorParallelModule {
  static_assert(std::is_convertible_v<decltype(std::declval<M&>().forward(std::declval<const at::Tensor&>())), at::Tensor>,
                "fsdpp::TensorParallel<M>: M's forward must take one tensor and return one");

 public:
  explicit TensorParallelImpl(std::shared_ptr<M> module)
      : TensorParallelModule(module, [m = module.get()](const at::Tensor& x) -> at::Tensor { return m->forward(x); }),
        typed_(std::move(module)) {}
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
// changes anything: an FQN that names no submodule, a module its style does not apply to (Colwise/
// Rowwise: Linear or Embedding; SequenceParallel: LayerNorm), a plain module its parent calls through a typed member, or one parallelized twice is an error
// naming the FQN.
void parallelize_module(torch::nn::Module& module, const ProcessGroup& tp_group, const ParallelizePlan& plan);
void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan);

// Every parallelized module's parameters below `module`, with FQNs relative to it.
std::vector<TensorParallelParameter> tensor_parallel_parameters(torch::nn::Module& module);

}  // namespace fsdpp

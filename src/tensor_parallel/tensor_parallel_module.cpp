// TensorParallelModule: a Linear or Embedding with its weight split across the TP group, its
// forward the local op between the style's redistributions (PyTorch's ColwiseParallel and
// RowwiseParallel with their default layouts).
#include <fsdpp/tensor_parallel.h>

#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/error.h>

#include "tensor_parallel/tp_collectives.h"

namespace fsdpp {
namespace {

const char* style_name(const ParallelStyle& style) {
  return std::holds_alternative<ColwiseParallel>(style) ? "ColwiseParallel" : "RowwiseParallel";
}

}  // namespace

TensorParallelModule::TensorParallelModule(std::shared_ptr<torch::nn::Module> module)
    : torch::nn::Module("fsdpp::TensorParallel"), module_(std::move(module)) {
  if (!module_) throw Error("TensorParallel: no module to wrap");
  linear_ = dynamic_cast<torch::nn::LinearImpl*>(module_.get());
  embedding_ = dynamic_cast<torch::nn::EmbeddingImpl*>(module_.get());
  if (!linear_ && !embedding_)
    throw Error("TensorParallel: " + module_->name() + " is not a torch::nn::Linear or torch::nn::Embedding");
  // The same tensors under the same names: the wrapper's parameter FQNs are the plain model's.
  for (const auto& p : module_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
}

void TensorParallelModule::parallelize(const ParallelStyle& style, const ProcessGroup& tp_group,
                                       const std::string& fqn) {
  const std::string who = "parallelize_module: '" + fqn + "' (" + module_->name() + ", " + style_name(style) + ")";
  if (style_) throw Error(who + " is already parallelized");
  if (!tp_group.is_member()) throw Error(who + ": this rank is not a member of the TP group " + tp_group.name());
  const bool colwise = std::holds_alternative<ColwiseParallel>(style);
  std::vector<std::pair<std::string, Placement>> placements;
  if (linear_) {
    placements.emplace_back("weight", Placement::shard(colwise ? 0 : 1));
    if (linear_->bias.defined()) placements.emplace_back("bias", colwise ? Placement::shard(0) : Placement::replicate());
  } else {
    const auto& o = embedding_->options;
    if (o.max_norm()) throw Error(who + ": max_norm is not supported (it renormalizes whole rows)");
    if (o.sparse()) throw Error(who + ": sparse gradients are not supported");
    if (!colwise && o.scale_grad_by_freq())
      throw Error(who + ": scale_grad_by_freq is not supported with row-wise sharding");
    placements.emplace_back("weight", Placement::shard(colwise ? 1 : 0));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, placement] : placements) {
    at::Tensor p = named_parameters(/*recurse=*/false)[name];
    TensorLayout layout(p.sizes().vec(), placement, tp_group);
    // In place (same TensorImpl), so the wrapped module and optimizers made later see the part.
    if (placement.is_shard()) p.set_data(layout.local_of_full(p).contiguous().clone());
    p.mutable_grad() = at::Tensor();
    params_.push_back({name, p, std::move(layout)});
  }
  style_ = style;
  group_ = tp_group;
  fqn_ = fqn;
}

at::Tensor TensorParallelModule::forward(const at::Tensor& input) {
  if (!style_) return linear_ ? linear_->forward(input) : embedding_->forward(input);
  return linear_ ? linear_forward(input) : embedding_forward(input);
}

at::Tensor TensorParallelModule::linear_forward(const at::Tensor& input) {
  const at::Tensor& w = linear_->weight;
  const at::Tensor& b = linear_->bias;
  if (const auto* col = std::get_if<ColwiseParallel>(&*style_)) {
    at::Tensor y = at::linear(detail::tp_copy_to_parallel(input, group_), w, b);
    if (col->output_layouts_ == TPLayout::Replicate)
      y = detail::tp_gather_last_dim(y, linear_->options.out_features(), group_);
    return y;
  }
  const auto& row = std::get<RowwiseParallel>(*style_);
  at::Tensor x = row.input_layouts_ == TPLayout::Replicate ? detail::tp_split_last_dim(input, group_) : input;
  if (x.dim() == 0 || x.size(-1) != w.size(1))
    throw Error("TensorParallel '" + fqn_ + "' (RowwiseParallel): its input " + c10::str(input.sizes()) +
                " should hold this rank's " + std::to_string(w.size(1)) + " of " +
                std::to_string(linear_->options.in_features()) +
                " in-features in its last dim (input_layouts(TPLayout::Replicate) takes a replicated input)");
  // Partial sums -> Replicate; the replicated bias once, after the reduction.
  at::Tensor y = detail::tp_reduce_from_parallel(at::linear(x, w), group_);
  return b.defined() ? y + b : y;
}

at::Tensor TensorParallelModule::embedding_forward(const at::Tensor& ids) {
  const at::Tensor& w = embedding_->weight;
  const auto& o = embedding_->options;
  const int64_t padding_idx = o.padding_idx() ? *o.padding_idx() : -1;
  if (const auto* col = std::get_if<ColwiseParallel>(&*style_)) {
    at::Tensor y = at::embedding(w, ids, padding_idx, o.scale_grad_by_freq(), false);
    if (col->output_layouts_ == TPLayout::Replicate) y = detail::tp_gather_last_dim(y, o.embedding_dim(), group_);
    return y;
  }
  // Row-wise: each rank looks up the ids among its rows and gives zeros for the others; the sum
  // over ranks is the full lookup.
  const TensorLayout& layout = params_.front().layout;
  const int64_t offset = layout.local_offset(group_.rank()), rows = w.size(0);
  at::Tensor y;
  if (rows == 0) {
    std::vector<int64_t> shape = ids.sizes().vec();
    shape.push_back(o.embedding_dim());
    y = at::zeros(shape, w.options());
  } else {
    const at::Tensor outside = (ids < offset).logical_or(ids >= offset + rows);
    const at::Tensor local_ids = (ids - offset).masked_fill(outside, 0);
    const int64_t local_padding = padding_idx >= offset && padding_idx < offset + rows ? padding_idx - offset : -1;
    y = at::embedding(w, local_ids, local_padding, false, false).masked_fill(outside.unsqueeze(-1), 0);
  }
  return detail::tp_reduce_from_parallel(y, group_);
}

std::vector<TensorParallelParameter> tensor_parallel_parameters(torch::nn::Module& module) {
  std::vector<TensorParallelParameter> out;
  const auto add = [&out](const torch::nn::Module& m, const std::string& prefix) {
    const auto* tp = dynamic_cast<const TensorParallelModule*>(&m);
    if (!tp) return;
    for (TensorParallelParameter p : tp->tp_parameters()) {
      if (!prefix.empty()) p.name = prefix + "." + p.name;
      out.push_back(std::move(p));
    }
  };
  // Not include_self: that needs `module` to be owned by a shared_ptr.
  add(module, "");
  for (const auto& item : module.named_modules("", /*include_self=*/false)) add(*item.value(), item.key());
  return out;
}

}  // namespace fsdpp

// TensorParallelModule: the wrapper of a module under a parallel style. Construction (the wrapped
// module's parameters, buffers and children under their own names), parallelize (the
// parameters cut in place) and the forward of PrepareModuleInput; the styles' forwards of
// Linear, Embedding and LayerNorm are in tp_forward.cpp.
#include <fsdpp/tensor_parallel.h>

#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/normalization.h>

#include <fsdpp/error.h>

#include "tensor_parallel/parallel_style.h"
#include "tensor_parallel/tp_collectives.h"

namespace fsdpp {

TensorParallelModule::TensorParallelModule(std::shared_ptr<torch::nn::Module> module, ForwardFn forward)
    : torch::nn::Module("fsdpp::TensorParallel"), module_(std::move(module)), forward_(std::move(forward)) {
  if (!module_) throw Error("TensorParallel: no module to wrap");
  linear_ = dynamic_cast<torch::nn::LinearImpl*>(module_.get());
  embedding_ = dynamic_cast<torch::nn::EmbeddingImpl*>(module_.get());
  layer_norm_ = dynamic_cast<torch::nn::LayerNormImpl*>(module_.get());
  // The same tensors and modules under the same names: the wrapper's FQNs are the plain model's.
  for (const auto& p : module_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : module_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& c : module_->named_children()) register_module(c.key(), c.value());
}

void TensorParallelModule::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

std::string TensorParallelModule::who() const {
  return "TensorParallel '" + fqn_ + "' (" + to_string(*style_) + ")";
}

void TensorParallelModule::parallelize(const ParallelStyle& style, const ProcessGroup& tp_group,
                                       const std::string& fqn) {
  const std::string who = "parallelize_module: '" + fqn + "' (" + module_->name() + ", " + detail::style_name(style) + ")";
  if (style_) throw Error(who + " is already parallelized");
  if (!tp_group.is_member()) throw Error(who + ": this rank is not a member of the TP group " + tp_group.name());
  detail::check_style_applies(style, *module_, "parallelize_module: '" + fqn + "'");
  std::vector<std::pair<std::string, Placement>> placements;
  const bool colwise = std::holds_alternative<ColwiseParallel>(style);
  if (std::holds_alternative<SequenceParallel>(style)) {
    // Replicated; their layouts let state dicts and clip_grad_norm_ know them as TP parameters.
    for (const auto& p : named_parameters(/*recurse=*/false)) placements.emplace_back(p.key(), Placement::replicate());
  } else if (linear_ && !std::holds_alternative<PrepareModuleInput>(style)) {
    placements.emplace_back("weight", Placement::shard(colwise ? 0 : 1));
    if (linear_->bias.defined()) placements.emplace_back("bias", colwise ? Placement::shard(0) : Placement::replicate());
  } else if (embedding_ && !std::holds_alternative<PrepareModuleInput>(style)) {
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
  if (!style_) return forward_(input);
  if (std::holds_alternative<PrepareModuleInput>(*style_)) return prepared_forward(input);
  if (layer_norm_) return layer_norm_forward(input);
  return linear_ ? linear_forward(input) : embedding_forward(input);
}

at::Tensor TensorParallelModule::prepared_forward(const at::Tensor& input) {
  const auto& p = std::get<PrepareModuleInput>(*style_);
  const TPLayout& from = p.input_layouts_;
  const TPLayout& to = p.desired_input_layouts_;
  at::Tensor x = input;
  if (from.is_shard() && to.is_replicate()) {
    // The module's consumers keep a Replicate input's gradient replicated (e.g. ColwiseParallel
    // all-reduces it), so backward keeps this rank's part.
    x = detail::tp_gather(input, from.dim(), /*extent=*/-1, detail::TPGrad::Replicated, group_, who());
  } else if (from.is_replicate() && to.is_shard()) {
    x = detail::tp_split(input, detail::tp_normalize_dim(to.dim(), input.dim(), who()), group_);
  } else if (from.is_shard() &&
             detail::tp_normalize_dim(from.dim(), input.dim(), who()) !=
                 detail::tp_normalize_dim(to.dim(), input.dim(), who())) {
    throw Error(who() + ": redistributing between two Shard layouts is not supported");
  }
  return forward_(x);
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

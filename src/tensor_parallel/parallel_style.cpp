#include "tensor_parallel/parallel_style.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <fsdpp/error.h>

namespace fsdpp {

std::string to_string(const ParallelStyle& style) {
  const auto layouts = [](const char* a, const TPLayout& x, const char* b, const TPLayout& y) {
    return std::string("(") + a + "=" + x.to_string() + ", " + b + "=" + y.to_string() + ")";
  };
  if (const auto* c = std::get_if<ColwiseParallel>(&style))
    return "ColwiseParallel" + layouts("input_layouts", c->input_layouts_, "output_layouts", c->output_layouts_);
  if (const auto* r = std::get_if<RowwiseParallel>(&style))
    return "RowwiseParallel" + layouts("input_layouts", r->input_layouts_, "output_layouts", r->output_layouts_);
  if (const auto* s = std::get_if<SequenceParallel>(&style))
    return "SequenceParallel(sequence_dim=" + std::to_string(s->sequence_dim_) + ")";
  const auto& p = std::get<PrepareModuleInput>(style);
  return "PrepareModuleInput" +
         layouts("input_layouts", p.input_layouts_, "desired_input_layouts", p.desired_input_layouts_);
}

namespace detail {

const char* style_name(const ParallelStyle& style) {
  static const char* const names[] = {"ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput"};
  return names[style.index()];
}

void check_style_applies(const ParallelStyle& style, const torch::nn::Module& module, const std::string& who) {
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&module);
  const auto* embedding = dynamic_cast<const torch::nn::EmbeddingImpl*>(&module);
  const std::string what = who + " (" + to_string(style) + ")";
  if (const auto* p = std::get_if<PrepareModuleInput>(&style)) {
    if (p->input_layouts_.is_shard() && p->desired_input_layouts_.is_shard() &&
        p->input_layouts_ != p->desired_input_layouts_)
      throw Error(what + ": redistributing between two Shard layouts (an all-to-all) is not supported");
    return;
  }
  if (std::holds_alternative<SequenceParallel>(style)) {
    if (!dynamic_cast<const torch::nn::LayerNormImpl*>(&module))
      throw Error(who + " is a " + module.name() + "; SequenceParallel applies to torch::nn::LayerNorm");
    return;
  }
  if (!linear && !embedding)
    throw Error(who + " is a " + module.name() +
                "; ColwiseParallel and RowwiseParallel apply to torch::nn::Linear and torch::nn::Embedding");
  if (const auto* c = std::get_if<ColwiseParallel>(&style)) {
    if (embedding && !c->input_layouts_.is_replicate())
      throw Error(what + ": an Embedding's ids are replicated (input_layouts must be Replicate())");
  } else {
    const auto& r = std::get<RowwiseParallel>(style);
    if (linear && r.output_layouts_.is_shard() && r.output_layouts_.dim() == -1)
      throw Error(what + ": the output's last dim (the out features) cannot be sharded; Shard a leading dim "
                         "(the sequence, Shard(1)) or Replicate()");
  }
  if (embedding) {
    const auto& o = embedding->options;
    const bool colwise = std::holds_alternative<ColwiseParallel>(style);
    if (o.max_norm()) throw Error(what + ": max_norm is not supported (it renormalizes whole rows)");
    if (o.sparse()) throw Error(what + ": sparse gradients are not supported");
    if (!colwise && o.scale_grad_by_freq())
      throw Error(what + ": scale_grad_by_freq is not supported with row-wise sharding");
  }
}

}  // namespace detail
}  // namespace fsdpp

// The forwards of the parallel styles on Linear, Embedding (ColwiseParallel, RowwiseParallel) and
// LayerNorm (SequenceParallel): the local op between the style's redistributions.
#include <fsdpp/tensor_parallel.h>

#include <string>

#include <ATen/ATen.h>
#include <torch/nn/modules/normalization.h>

#include <fsdpp/error.h>

#include "tensor_parallel/tp_collectives.h"

namespace fsdpp {

using detail::TPGrad;

namespace {

// ColwiseParallel's local output, Shard(-1) of `features`, in its output_layouts. PyTorch
// redistributes to any Shard(d); a leading d would be an all-to-all, which fsdpp does not have.
at::Tensor colwise_output(const at::Tensor& y, const TPLayout& out, int64_t features, const ProcessGroup& group,
                          const std::string& who) {
  if (out.is_replicate()) return detail::tp_gather(y, -1, features, TPGrad::Replicated, group, who);
  if (detail::tp_normalize_dim(out.dim(), y.dim(), who) != y.dim() - 1)
    throw Error(who + ": the output is sharded along its last dim (the features) or replicated");
  return y;
}

}  // namespace

at::Tensor TensorParallelModule::linear_forward(const at::Tensor& input) {
  const at::Tensor& w = linear_->weight;
  const at::Tensor& b = linear_->bias;
  if (const auto* col = std::get_if<ColwiseParallel>(&*style_)) {
    at::Tensor x;
    if (col->input_layouts_.is_replicate()) {
      x = detail::tp_copy_to_parallel(input, group_);
    } else {
      // Sequence parallelism: gathered along the sharded dim; the matmul below is its only
      // consumer, so its gradient is this rank's partial sum, reduce-scattered back.
      if (input.dim() == 0) throw Error(who() + ": a 0-dim input cannot be sharded");
      const int64_t d = detail::tp_normalize_dim(col->input_layouts_.dim(), input.dim(), who());
      const int64_t extent = d == input.dim() - 1 ? linear_->options.in_features() : -1;
      x = detail::tp_gather(input, d, extent, TPGrad::Partial, group_, who());
    }
    return colwise_output(at::linear(x, w, b), col->output_layouts_, linear_->options.out_features(), group_, who());
  }
  const auto& row = std::get<RowwiseParallel>(*style_);
  if (input.dim() == 0) throw Error(who() + ": a 0-dim input has no features");
  at::Tensor x = row.input_layouts_.is_replicate() ? detail::tp_split(input, input.dim() - 1, group_) : input;
  if (row.input_layouts_.is_shard() && row.input_layouts_.dim() != -1 &&
      detail::tp_normalize_dim(row.input_layouts_.dim(), input.dim(), who()) != input.dim() - 1)
    throw Error(who() + ": the input " + c10::str(input.sizes()) +
                " must be sharded along its last dim (the in-features) or replicated");
  if (x.size(-1) != w.size(1))
    throw Error("TensorParallel '" + fqn_ + "' (RowwiseParallel): its input " + c10::str(input.sizes()) +
                " should hold this rank's " + std::to_string(w.size(1)) + " of " +
                std::to_string(linear_->options.in_features()) +
                " in-features in its last dim (input_layouts(TPLayout::Replicate) takes a replicated input)");
  const at::Tensor partial = at::linear(x, w);
  if (row.output_layouts_.is_replicate()) {
    // Partial sums -> Replicate; the replicated bias once, after the reduction.
    at::Tensor y = detail::tp_reduce_from_parallel(partial, group_);
    return b.defined() ? y + b : y;
  }
  const int64_t d = detail::tp_normalize_dim(row.output_layouts_.dim(), partial.dim(), who());
  if (d == partial.dim() - 1) throw Error(who() + ": the output's last dim (the out features) cannot be sharded");
  // Partial sums -> Shard(d); the bias meets only this rank's rows, so its gradient is partial.
  at::Tensor y = detail::tp_reduce_scatter(partial, d, group_);
  return b.defined() ? y + detail::tp_copy_to_parallel(b, group_) : y;
}

at::Tensor TensorParallelModule::embedding_forward(const at::Tensor& ids) {
  const at::Tensor& w = embedding_->weight;
  const auto& o = embedding_->options;
  const int64_t padding_idx = o.padding_idx() ? *o.padding_idx() : -1;
  if (const auto* col = std::get_if<ColwiseParallel>(&*style_)) {
    return colwise_output(at::embedding(w, ids, padding_idx, o.scale_grad_by_freq(), false), col->output_layouts_,
                          o.embedding_dim(), group_, who());
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
  const TPLayout& out = std::get<RowwiseParallel>(*style_).output_layouts_;
  if (out.is_replicate()) return detail::tp_reduce_from_parallel(y, group_);
  return detail::tp_reduce_scatter(y, detail::tp_normalize_dim(out.dim(), y.dim(), who()), group_);
}

at::Tensor TensorParallelModule::layer_norm_forward(const at::Tensor& input) {
  const auto& o = layer_norm_->options;
  const int64_t seq = std::get<SequenceParallel>(*style_).sequence_dim_;
  const int64_t d = detail::tp_normalize_dim(seq, input.dim(), who());
  const int64_t normalized = static_cast<int64_t>(o.normalized_shape().size());
  if (d >= input.dim() - normalized)
    throw Error(who() + ": the sequence dim " + std::to_string(seq) + " of its input " + c10::str(input.sizes()) +
                " is among the " + std::to_string(normalized) + " normalized dims " +
                c10::str(c10::IntArrayRef(o.normalized_shape())));
  // The local rows normalized; the replicated weight and bias see only them, so their gradients
  // are partial: all-reduced in backward (identical on every TP rank afterwards).
  const at::Tensor& w = layer_norm_->weight;
  const at::Tensor& b = layer_norm_->bias;
  return at::layer_norm(input, o.normalized_shape(), w.defined() ? detail::tp_copy_to_parallel(w, group_) : w,
                        b.defined() ? detail::tp_copy_to_parallel(b, group_) : b, o.eps(),
                        /*cudnn_enable=*/true);
}

}  // namespace fsdpp

#include "fsdp/fsdp_param.h"


#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <fsdpp/error.h>

#include "common/shape_string.h"
#include "compat/meta_device.h"

namespace fsdpp::detail {
namespace {

bool same_binding(const at::Tensor& a, const at::Tensor& b) {
  return a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl() &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() && a.strides() == b.strides();
}

}  // namespace

FSDPParam::FSDPParam(std::string fqn, at::Tensor param, const ProcessGroup& group)
    : fqn_(std::move(fqn)),
      param_(std::move(param)),
      layout_(param_.sizes().vec(), Placement::shard(0), group),
      rank_(group.rank()) {
  numel_ = param_.numel();
  dim0_ = param_.dim() == 0 ? 1 : param_.size(0);
  for (int64_t d = 1; d < param_.dim(); ++d) row_numel_ *= param_.size(d);
  sharded_size_ = layout_.local_shape(rank_);
}

void FSDPParam::init_sharded(const at::Tensor& padded_chunk) {
  at::NoGradGuard no_grad;
  padded_chunk_ = padded_chunk;
  sharded_view_ = padded_chunk.narrow(0, 0, local_rows() * row_numel_).view(sharded_size_);
  param_.mutable_grad().reset();
  if (param_.is_meta()) {
    // Built under deferred_init: no values to copy; materialize_module gives them.
    compat::give_meta_tensor_data(param_, sharded_view_);
  } else {
    sharded_view_.copy_(layout_.local_of_full(param_.detach()));
    param_.set_data(sharded_view_);
  }
  sharded_ = true;
}

void FSDPParam::rebind_sharded(const at::Tensor& padded_chunk) {
  if (param_.sizes() != sharded_view_.sizes())
    throw Error("FSDP parameter '" + fqn_ + "' was replaced by a tensor of shape " + shape_string(param_.sizes()) +
                " while sharded; expected its shard " + shape_string(sharded_view_.sizes()));
  at::NoGradGuard no_grad;
  padded_chunk_ = padded_chunk;
  sharded_view_ = padded_chunk.narrow(0, 0, local_rows() * row_numel_).view(sharded_size_);
  sharded_view_.copy_(param_.detach());
  at::Tensor& grad = param_.mutable_grad();
  if (grad.defined()) grad = grad.to(padded_chunk.scalar_type());
  param_.set_data(sharded_view_);
}

void FSDPParam::init_unsharded(const at::Tensor& region) {
  unsharded_region_ = region;
  unsharded_view_ = region.narrow(0, 0, numel_).view(unsharded_size());
}

void FSDPParam::copy_full_into_unsharded() {
  at::NoGradGuard no_grad;
  unsharded_view_.copy_(param_.detach());
}

void FSDPParam::write_back_unsharded() {
  const int64_t rows = local_rows();
  if (rows == 0 || numel_ == 0) return;
  at::NoGradGuard no_grad;
  at::Tensor all_rows = unsharded_region_.view({-1, row_numel_});
  padded_chunk_.view({chunk_rows(), row_numel_}).narrow(0, 0, rows).copy_(all_rows.narrow(0, row_offset(rank_), rows));
}

void FSDPParam::to_unsharded() {
  if (!sharded_) return;
  at::Tensor& grad = param_.mutable_grad();
  if (grad.defined()) {
    stashed_grad_ = grad;
    grad.reset();
  }
  param_.set_data(unsharded_view_);
  sharded_ = false;
}

void FSDPParam::to_sharded() {
  if (sharded_) return;
  at::Tensor& grad = param_.mutable_grad();
  // A full-shaped gradient left here (a backward FSDP did not see) has no place in a shard.
  grad.reset();
  param_.set_data(sharded_view_);
  if (stashed_grad_.defined()) {
    grad = stashed_grad_;
    stashed_grad_.reset();
  }
  sharded_ = true;
}

void FSDPParam::check_sharded_data() {
  if (!sharded_ || same_binding(param_, sharded_view_)) return;
  if (param_.sizes() != sharded_view_.sizes() || param_.scalar_type() != sharded_view_.scalar_type() ||
      param_.device() != sharded_view_.device())
    throw Error("FSDP parameter '" + fqn_ + "' was replaced by a tensor of shape " + shape_string(param_.sizes()) + " " +
                std::string(c10::toString(param_.scalar_type())) + " on " + param_.device().str() +
                " while sharded; expected its shard " + shape_string(sharded_view_.sizes()) + " " +
                std::string(c10::toString(sharded_view_.scalar_type())) + " on " + sharded_view_.device().str() +
                " (changing the dtype, shape or device after wrapping is not supported)");
  at::NoGradGuard no_grad;
  sharded_view_.copy_(param_.detach());
  param_.set_data(sharded_view_);
}

}  // namespace fsdpp::detail

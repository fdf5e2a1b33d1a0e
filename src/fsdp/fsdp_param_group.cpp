#include "fsdp/fsdp_param_group.h"

#include <functional>
#include <utility>

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <fsdpp/error.h>
#include <fsdpp/profiler.h>

#include "fsdp/fsdp_collectives.h"
#include "fsdp/storage_memory.h"
#include "profiler/timeline.h"

namespace fsdpp::detail {
namespace {

// The allocator knows only bytes; the unit whose collective asked for them is named here.
c10::OutOfMemoryError out_of_memory_in(const std::string& unit, const c10::OutOfMemoryError& e) {
  return c10::OutOfMemoryError(c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                               "FSDP unit " + unit + ": " + e.what_without_backtrace());
}

}  // namespace

void FSDPParamGroup::rebind_compute_buffer() {
  allocate_storage(unsharded_flat_);
  bind_unsharded(unsharded_flat_);
  release_storage(unsharded_flat_);
}

// The collectives in flight are waited for by their own destructors; the parameters stay shards.
FSDPParamGroup::~FSDPParamGroup() = default;

void FSDPParamGroup::bind_flat_buffers(const at::TensorOptions& options, bool initial) {
  sharded_flat_ = at::zeros({flat_layout_.shard_numel()}, options);
  unsharded_flat_ = at::empty({flat_layout_.unsharded_numel()}, compute_options());
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    at::Tensor chunk = sharded_flat_.narrow(0, flat_layout_.shard_offset(i), p.padded_chunk_numel());
    if (initial)
      p.init_sharded(chunk);
    else
      p.rebind_sharded(chunk);
  }
  bind_unsharded(unsharded_flat_);
  release_storage(unsharded_flat_);
}

void FSDPParamGroup::bind_unsharded(const at::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].init_unsharded(flat.narrow(0, flat_layout_.unsharded_offset(i), params_[i].padded_chunk_numel() * world_size_));
}

at::TensorOptions FSDPParamGroup::sharded_options(at::ScalarType dtype) const {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(compute_device_);
  if (!offload_policy_.offload_to_cpu()) return options;
  // Pinned memory only speeds up copies to an accelerator (and needs one).
  return options.device(at::kCPU).pinned_memory(offload_policy_.pin_memory() && !compute_device_.is_cpu());
}

at::TensorOptions FSDPParamGroup::compute_options() const {
  return at::TensorOptions()
      .device(compute_device_)
      .dtype(param_dtype_.value_or(sharded_flat_.scalar_type()));
}

int64_t FSDPParamGroup::unsharded_compute_bytes() const {
  return flat_layout_.unsharded_numel() * static_cast<int64_t>(c10::elementSize(compute_options().dtype().toScalarType()));
}

int64_t FSDPParamGroup::unsharded_reduce_bytes() const {
  return flat_layout_.unsharded_numel() * static_cast<int64_t>(c10::elementSize(reduce_options().dtype().toScalarType()));
}

at::TensorOptions FSDPParamGroup::reduce_options() const {
  return compute_options().dtype(reduce_dtype_.value_or(compute_options().dtype().toScalarType()));
}

void FSDPParamGroup::handle_dtype_change() {
  bool changed = false;
  for (const auto& p : params_) changed = changed || p.dtype_changed();
  if (!changed) return;
  const at::ScalarType dtype = params_.front().param().scalar_type();
  for (const auto& p : params_)
    if (p.param().scalar_type() != dtype)
      throw Error("FSDP unit " + unit_name_ + ": parameter '" + p.fqn() + "' is " +
                  std::string(c10::toString(p.param().scalar_type())) + " but '" + params_.front().fqn() + "' is " +
                  std::string(c10::toString(dtype)) + "; one unit needs one dtype");
  if (gradient_reduce_.pending() || all_gather_.in_flight())
    throw Error("FSDP unit " + unit_name_ + ": parameters were cast while a collective was in flight");
  bind_flat_buffers(sharded_options(dtype), /*initial=*/false);
  for (auto& g : accumulated_grads_)
    if (g.defined()) g = g.to(reduce_options().dtype());
}

void FSDPParamGroup::finish_all_gather(bool keep) {
  auto drop_full_precision = [&] {
    full_precision_flat_ = at::Tensor();
    gathering_full_precision_ = false;
  };
  try {
    all_gather_.finish(keep);
  } catch (const c10::OutOfMemoryError& e) {
    drop_full_precision();
    throw out_of_memory_in(unit_name_, e);
  } catch (...) {
    drop_full_precision();
    throw;
  }
  if (!keep) drop_full_precision();
}

void FSDPParamGroup::unshard(UnshardFor purpose) {
  if (is_unsharded() || all_gather_.in_flight()) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::unshard", trace_name_));
  // A reduce-scatter left in flight by a backward that was not the last one.
  finalize_backward();
  if (purpose != UnshardFor::kBackward) drop_post_forward_shard();
  if (sharded_state_ == ShardedState::kShardedPostForward) {
    all_gather_.start(post_forward_shard_, post_forward_group_, post_forward_gather_layout_, unsharded_flat_,
                      comm_context_->all_gather);
    return;
  }
  // Optimizer steps write into the shards in place; a user's set_data is folded back here.
  handle_dtype_change();
  for (auto& p : params_) p.check_sharded_data();
  // Mixed precision: the all-gather moves the compute dtype, cast from the shards (FSDP2's
  // all-gather input); CPU offload: copied to the compute device. The input lives until the
  // collective finished with it.
  const at::ScalarType dtype = compute_options().dtype().toScalarType();
  gathering_full_precision_ = purpose == UnshardFor::kFullPrecision && dtype != sharded_flat_.scalar_type();
  const at::TensorOptions input_options =
      gathering_full_precision_ ? at::TensorOptions().dtype(sharded_flat_.scalar_type()).device(compute_device_)
                                : compute_options();
  // Its memory comes when the exchange starts (in place) or at the wait.
  if (gathering_full_precision_) full_precision_flat_ = unallocated(flat_layout_.unsharded_numel(), input_options);
  const at::Tensor& target = gathering_full_precision_ ? full_precision_flat_ : unsharded_flat_;
  AllGatherInput input = all_gather_input(sharded_flat_, input_options);
  all_gather_.start(input.input, process_group_, gather_layout_, target, comm_context_->all_gather,
                    std::move(input.copy_in));
}

void FSDPParamGroup::drop_post_forward_shard() {
  if (sharded_state_ != ShardedState::kShardedPostForward) return;
  release_storage(post_forward_shard_);
  post_forward_shard_ = at::Tensor();
  sharded_state_ = ShardedState::kSharded;
}

void FSDPParamGroup::write_back_unsharded() {
  if (!is_unsharded()) return;
  for (auto& p : params_) p.write_back_unsharded();
}

void FSDPParamGroup::reshard_after_forward() {
  if (!reshard_policy_.reshards()) return;
  if (post_forward_size() == 0 || !is_unsharded()) {
    reshard();
    return;
  }
  // Keep the sharded flats of ranks [j * N/k, (j + 1) * N/k), one after another.
  const int64_t per_member = world_size_ / post_forward_size();
  const int64_t first = post_forward_group_.rank() * per_member;
  at::NoGradGuard no_grad;
  at::Tensor kept = flat_layout_.post_forward_shard(params_, first, per_member, unsharded_flat_.options());
  reshard();
  post_forward_shard_ = std::move(kept);
  sharded_state_ = ShardedState::kShardedPostForward;
}

void FSDPParamGroup::wait_for_unshard() {
  if (is_unsharded()) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::wait_for_unshard", trace_name_));
  if (!all_gather_.in_flight()) unshard();
  finish_all_gather(/*keep=*/true);
  at::NoGradGuard no_grad;
  if (gathering_full_precision_) {
    gathering_full_precision_ = false;
    bind_unsharded(full_precision_flat_);
  }
  drop_post_forward_shard();
  for (auto& p : params_) p.to_unsharded();
  sharded_state_ = ShardedState::kUnsharded;
}

std::vector<at::Tensor> FSDPParamGroup::full_values() const {
  // Views of one buffer of their own (no second copy of the unit).
  const at::Tensor unsharded = gather_unsharded_copy(sharded_flat_, flat_layout_, gather_layout_, process_group_, compute_device_);
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    out.push_back(unsharded.narrow(0, flat_layout_.unsharded_offset(i), p.numel()).view(p.unsharded_size()));
  }
  return out;
}

ShardedTensor FSDPParamGroup::flat_value() const {
  return flat_layout_.local_flat_value(params_, sharded_flat_.scalar_type(), process_group_);
}

std::vector<at::Tensor> FSDPParamGroup::local_rows_from_flat(const ShardedTensor& flat) const {
  return flat_layout_.local_rows_from_flat(params_, flat, rank_, unit_name_);
}

void FSDPParamGroup::drop_pending_unshard() {
  if (all_gather_.in_flight()) finish_all_gather(/*keep=*/false);
}

void FSDPParamGroup::reshard() {
  // A gather nobody waited for: finish it so the group stays in step, then drop it.
  drop_pending_unshard();
  drop_post_forward_shard();
  if (!is_unsharded()) return;
  for (auto& p : params_) p.to_sharded();
  if (full_precision_flat_.defined()) {
    rebind_compute_buffer();
    full_precision_flat_ = at::Tensor();
  }
  release_storage(unsharded_flat_);
  sharded_state_ = ShardedState::kSharded;
}

bool FSDPParamGroup::post_backward(const std::function<void()>& after_release) {
  profiler::record_function span(profiler::detail::span_name("FSDP::post_backward", trace_name_));
  if (gradient_reduce_.pending())
    throw Error("FSDP unit " + unit_name_ + ": a second post-backward before the previous reduce-scatter finished");
  std::vector<at::Tensor> grads(params_.size());
  std::vector<char> had_grad(params_.size(), 0);
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& g = params_[i].param().mutable_grad();
    if (g.defined() && !params_[i].is_sharded()) {
      grads[i] = g;
      g.reset();
      had_grad[i] = 1;
      any = true;
    }
  }
  at::NoGradGuard no_grad;
  if (accumulated_grads_.empty()) accumulated_grads_.resize(params_.size());
  if (!requires_gradient_sync_) {
    // Summed in the reduce dtype (float32 under a bfloat16 compute policy loses nothing more
    // per microbatch).
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!had_grad[i]) continue;
      if (accumulated_grads_[i].defined())
        accumulated_grads_[i].add_(grads[i]);
      else
        accumulated_grads_[i] = grads[i].to(reduce_options().dtype());
    }
    grads.clear();
    if (reshard_after_backward_) reshard();
    after_release();
    return false;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!accumulated_grads_[i].defined()) continue;
    grads[i] = had_grad[i] ? accumulated_grads_[i].add_(grads[i]) : accumulated_grads_[i];
    accumulated_grads_[i] = at::Tensor();
    had_grad[i] = 1;
    any = true;
  }
  if (!any) {
    reshard();
    after_release();
    return false;
  }
  // The parameters go before the reduce-scatter input is allocated: packing needs only the
  // gradients taken above, and the unit's gathered parameters, its gradients and the input
  // would otherwise coexist.
  reshard();
  try {
    gradient_reduce_.pack(params_, flat_layout_, grads, std::move(had_grad), reduce_options());
  } catch (const c10::OutOfMemoryError& e) {
    throw out_of_memory_in(unit_name_, e);
  }
  // After packing, which freed the gradients: a gather started here (BACKWARD_POST) lives
  // beside the input alone, and goes ahead of the reduce-scatter on the comm thread.
  try {
    after_release();
  } catch (...) {
    gradient_reduce_.drop_packed();
    throw;
  }
  gradient_reduce_.issue(flat_layout_, requires_all_reduce_, sharded_flat_.options(), *comm_context_);
  return true;
}

void FSDPParamGroup::finalize_backward() {
  if (!gradient_reduce_.pending()) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::finalize_backward", trace_name_));
  try {
    gradient_reduce_.finish(params_, flat_layout_, sharded_flat_.options());
  } catch (const c10::OutOfMemoryError& e) {
    throw out_of_memory_in(unit_name_, e);
  }
}

}  // namespace fsdpp::detail

#include "fsdp/fsdp_param_group.h"

#include <functional>
#include <utility>
#include <sstream>

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/profiler.h>

#include "comm/chained_collectives.h"
#include "comm/shm_transport.h"
#include "fsdp/fsdp_collectives.h"
#include "fsdp/testing_delays.h"
#include "memory/allocator_caching.h"
#include "profiler/timeline.h"

namespace fsdpp::detail {

FSDPParamGroup::FSDPParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, UnitGroups groups,
                               std::string unit_name, std::string trace_name, const ParamGroupPolicies& policies)
    : unit_name_(std::move(unit_name)),
      trace_name_(std::move(trace_name)),
      process_group_(std::move(groups.shard)),
      replicate_group_(groups.replicated() ? std::move(groups.replicate) : ProcessGroup()),
      offload_policy_(policies.offload_policy),
      param_dtype_(policies.mp_policy.param_dtype_),
      reduce_dtype_(policies.mp_policy.reduce_dtype_),
      reshard_policy_(policies.reshard_after_forward) {
  if (!process_group_.is_member()) throw Error("fully_shard of " + unit_name_ + ": this rank is not a member of group " + process_group_.name());
  rank_ = process_group_.rank();
  world_size_ = process_group_.size();
  post_forward_size_ = reshard_policy_.post_forward_size(world_size_);
  if (post_forward_size_ > 0) {
    post_forward_group_ = post_forward_group(process_group_, post_forward_size_);
  }
  if (params.empty()) throw Error("fully_shard of " + unit_name_ + ": no parameters to shard");
  const at::Tensor& first = params.front().second;
  for (auto& [name, p] : params) {
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device())
      throw Error("fully_shard of " + unit_name_ + ": parameter '" + name + "' is " +
                  std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() + " but '" +
                  params.front().first + "' is " + std::string(c10::toString(first.scalar_type())) + " on " +
                  first.device().str() + "; one unit needs one dtype and device");
    if (!p.is_contiguous() || p.layout() != at::kStrided)
      throw Error("fully_shard of " + unit_name_ + ": parameter '" + name + "' must be a dense contiguous tensor");
    params_.emplace_back(name, p, process_group_);
  }
  check_same_on_all_ranks();
  // Read once the check's all-reduce decided the group's transport (on its comm thread).
  gathers_in_place_ = world_size_ == 1 || uses_shared_memory(process_group_);
  flat_ = UnitFlatLayout(params_, world_size_);
  gather_layout_ = std::make_shared<const GatherLayout>(flat_.gather_layout());
  if (post_forward_size_ > 0)
    post_forward_gather_layout_ = std::make_shared<const GatherLayout>(flat_.gather_layout(world_size_ / post_forward_size_));
  compute_device_ = first.device();
  // The full parameters this frees are never allocated again: back to the system, not cached.
  NoCachingScope no_caching;
  bind_flat_buffers(sharded_options(first.scalar_type()), /*initial=*/true);
}

FSDPParamGroup::~FSDPParamGroup() {
  // Leave the parameters as shards; never throw from here.
  auto wait_quietly = [](const Work& work) {
    try {
      work.wait();
    } catch (...) {
    }
  };
  if (gathering_) wait_quietly(all_gather_work_);
  if (reduce_scatter_output_.defined()) {
    wait_quietly(reduce_scatter_work_);
    wait_quietly(all_reduce_work_);
  }
}

void FSDPParamGroup::check_same_on_all_ranks() {
  // A fingerprint of the unit's parameter names, shapes and dtypes; MAX of (h, -h) over the
  // group equals (h, -h) on every rank only if all ranks agree.
  std::string description;
  for (const auto& p : params_) {
    std::ostringstream one;
    one << "'" << p.fqn() << "' " << p.param().sizes() << " " << c10::toString(p.param().scalar_type()) << "; ";
    description += one.str();
  }
  const int64_t h = static_cast<int64_t>(std::hash<std::string>{}(description) >> 1);
  for (const ProcessGroup* group : {&process_group_, &replicate_group_}) {
    if (!group->defined()) continue;
    at::Tensor t = at::tensor(std::vector<int64_t>{h, -h}, at::kLong);
    all_reduce(t, ReduceOp::MAX, *group);
    if (t[0].item<int64_t>() != h || t[1].item<int64_t>() != -h)
      throw Error("fully_shard of " + unit_name_ + ": the ranks' models differ; rank " + std::to_string(group->rank()) +
                  " of group " + group->name() + " has " + description + "build the same model on every rank");
  }
}

void FSDPParamGroup::bind_flat_buffers(const at::TensorOptions& options, bool initial) {
  sharded_flat_ = at::zeros({flat_.shard_numel()}, options);
  unsharded_flat_ = at::empty({flat_.unsharded_numel()}, compute_options());
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    at::Tensor chunk = sharded_flat_.narrow(0, flat_.shard_offset(i), p.padded_chunk_numel());
    if (initial)
      p.init_sharded(chunk);
    else
      p.rebind_sharded(chunk);
  }
  bind_unsharded(unsharded_flat_);
  free_unsharded();
}

void FSDPParamGroup::bind_unsharded(const at::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].init_unsharded(flat.narrow(0, flat_.unsharded_offset(i), params_[i].padded_chunk_numel() * world_size_));
}

at::TensorOptions FSDPParamGroup::sharded_options(at::ScalarType dtype) const {
  at::TensorOptions options = at::TensorOptions().dtype(dtype).device(compute_device_);
  if (!offload_policy_.offload_to_cpu_) return options;
  // Pinned memory only speeds up copies to an accelerator (and needs one).
  return options.device(at::kCPU).pinned_memory(offload_policy_.pin_memory_ && !compute_device_.is_cpu());
}

at::TensorOptions FSDPParamGroup::compute_options() const {
  return at::TensorOptions()
      .device(compute_device_)
      .dtype(param_dtype_.value_or(sharded_flat_.scalar_type()));
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
  if (reduce_scatter_output_.defined() || gathering_)
    throw Error("FSDP unit " + unit_name_ + ": parameters were cast while a collective was in flight");
  bind_flat_buffers(sharded_options(dtype), /*initial=*/false);
  for (auto& g : accumulated_grads_)
    if (g.defined()) g = g.to(reduce_options().dtype());
}

namespace {
// Gives a tensor whose storage was released (or never allocated) the memory its sizes need.
void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

// A tensor of `numel` elements without memory yet: allocate_storage gives it some.
at::Tensor unallocated(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}

// Frees a tensor's memory now, even while other handles to its storage live on (a collective's
// closure shares it, and a reduce-scatter's `done` hook frees its input while the closure runs).
void release_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}
}  // namespace

void FSDPParamGroup::allocate_unsharded() { allocate_storage(unsharded_flat_); }

void FSDPParamGroup::free_unsharded() { release_storage(unsharded_flat_); }

void FSDPParamGroup::start_all_gather(const at::Tensor& input, const ProcessGroup& group,
                                      std::shared_ptr<const GatherLayout> layout, bool in_place) {
  // Not in place: rank-major, placed at the wait. The unit computing meanwhile has resharded by
  // then, so that output and the parameters never coexist with it (placed on the comm thread,
  // all three would).
  const at::Tensor& target = gathering_full_precision_ ? full_precision_flat_ : unsharded_flat_;
  if (!in_place) all_gather_output_ = unallocated(flat_.unsharded_numel(), input.options());
  const at::Tensor destination = in_place ? target : all_gather_output_;
  // Memory is allocated on the comm thread when the exchange starts, so a prefetch queued
  // behind a reduce-scatter does not coexist with that reduce-scatter's input.
  auto allocate = [destination] { allocate_storage(destination); };
  all_gather_work_ = in_place ? detail::all_gather_into_layout(destination, input, std::move(layout), group, allocate)
                              : detail::all_gather_into_tensor_prepared(destination, input, group, allocate);
  gathering_ = true;
}

void FSDPParamGroup::finish_all_gather(bool keep) {
  gathering_ = false;
  const at::Tensor output = std::exchange(all_gather_output_, at::Tensor());
  const at::Tensor target = gathering_full_precision_ ? full_precision_flat_ : unsharded_flat_;
  auto drop = [&] {
    if (gathering_full_precision_)
      full_precision_flat_ = at::Tensor();
    else
      free_unsharded();
    gathering_full_precision_ = false;
  };
  try {
    all_gather_work_.wait();
    if (keep && output.defined()) {
      allocate_storage(target);
      const auto& layout = post_forward_shard_.defined() ? post_forward_gather_layout_ : gather_layout_;
      layout->place_rank_major(target.data_ptr(), output.data_ptr(), output.element_size());
    }
  } catch (...) {
    if (output.defined()) release_storage(output);
    drop();
    throw;
  }
  if (output.defined()) release_storage(output);
  if (!keep) drop();
}

void FSDPParamGroup::unshard(UnshardFor purpose) {
  if (unsharded_ || gathering_) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::unshard", trace_name_));
  // A reduce-scatter left in flight by a backward that was not the last one.
  finalize_backward();
  if (purpose != UnshardFor::kBackward) drop_post_forward_shard();
  testing_delay(testing_delays().before_all_gather_ms);
  if (post_forward_shard_.defined()) {
    start_all_gather(post_forward_shard_, post_forward_group_, post_forward_gather_layout_, /*in_place=*/false);
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
  const at::Tensor input = gathering_full_precision_ ? sharded_flat_.to(compute_device_)
                                                     : sharded_flat_.to(compute_options(), /*non_blocking=*/sharded_flat_.is_pinned());
  // Its memory comes when the exchange starts (in place) or at the wait.
  if (gathering_full_precision_) full_precision_flat_ = unallocated(flat_.unsharded_numel(), input.options());
  start_all_gather(input, process_group_, gather_layout_, gathers_in_place_);
}

void FSDPParamGroup::drop_post_forward_shard() {
  if (!post_forward_shard_.defined()) return;
  release_storage(post_forward_shard_);
  post_forward_shard_ = at::Tensor();
}

void FSDPParamGroup::write_back_unsharded() {
  if (!unsharded_) return;
  at::NoGradGuard no_grad;
  for (const auto& p : params_) {
    const int64_t rows = p.local_rows();
    if (rows == 0) continue;
    at::Tensor all_rows = p.unsharded_region().view({world_size_ * p.chunk_rows(), p.row_numel()});
    p.padded_chunk().view({p.chunk_rows(), p.row_numel()}).narrow(0, 0, rows).copy_(all_rows.narrow(0, p.row_offset(rank_), rows));
  }
}

void FSDPParamGroup::reshard_after_forward() {
  if (!reshard_policy_.reshards()) return;
  if (post_forward_size_ == 0 || !unsharded_) {
    reshard();
    return;
  }
  // Keep the sharded flats of ranks [j * N/k, (j + 1) * N/k), one after another.
  const int64_t per_member = world_size_ / post_forward_size_;
  const int64_t first = post_forward_group_.rank() * per_member;
  at::NoGradGuard no_grad;
  at::Tensor kept = post_forward_shard(params_, flat_, first, per_member, unsharded_flat_.options());
  reshard();
  post_forward_shard_ = std::move(kept);
}

void FSDPParamGroup::wait_for_unshard() {
  if (unsharded_) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::wait_for_unshard", trace_name_));
  if (!gathering_) unshard();
  finish_all_gather(/*keep=*/true);
  at::NoGradGuard no_grad;
  if (gathering_full_precision_) {
    gathering_full_precision_ = false;
    bind_unsharded(full_precision_flat_);
  }
  drop_post_forward_shard();
  for (auto& p : params_) p.to_unsharded();
  unsharded_ = true;
}

std::vector<at::Tensor> FSDPParamGroup::full_values() const {
  at::NoGradGuard no_grad;
  // The values are views of one buffer of their own (no second copy of the unit): on one rank a
  // copy of the sharded flat, which is the unsharded flat.
  at::Tensor unsharded = sharded_flat_.to(compute_device_, /*non_blocking=*/false, /*copy=*/world_size_ == 1);
  if (world_size_ > 1) {
    at::Tensor input = std::move(unsharded);
    unsharded = at::empty({flat_.unsharded_numel()}, input.options());
    detail::all_gather_into_layout(unsharded, input, gather_layout_, process_group_, {}).wait();
  }
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    out.push_back(unsharded.narrow(0, flat_.unsharded_offset(i), p.numel()).view(p.unsharded_size()));
  }
  return out;
}

std::vector<ShardMetadata> FSDPParamGroup::flat_shards_metadata() const {
  std::vector<ShardMetadata> all;
  int64_t flat_offset = 0;
  for (const auto& p : params_) {
    for (int r = 0; r < world_size_; ++r)
      if (p.rows_of(r) > 0)
        all.push_back({{flat_offset + p.row_offset(r) * p.row_numel()}, {p.rows_of(r) * p.row_numel()}, r});
    flat_offset += p.numel();
  }
  return all;
}

ShardedTensor FSDPParamGroup::flat_value() const {
  std::vector<ShardMetadata> all = flat_shards_metadata();
  std::vector<Shard> mine;
  size_t next = 0;
  for (const auto& p : params_) {
    if (p.local_rows() == 0) continue;
    while (all[next].placement != rank_) ++next;
    mine.push_back({p.sharded_view().detach().reshape({-1}).clone(), all[next++]});
  }
  int64_t total = 0;
  for (const auto& p : params_) total += p.numel();
  return ShardedTensor::from_local_shards_and_global_metadata(std::move(mine), {total}, sharded_flat_.scalar_type(),
                                                              std::move(all), process_group_);
}

std::vector<at::Tensor> FSDPParamGroup::local_rows_from_flat(const ShardedTensor& flat) const {
  std::vector<at::Tensor> out;
  if (flat.has_shards(flat_shards_metadata(), world_size_)) {
    int64_t flat_offset = 0;
    for (const auto& p : params_) {
      const int64_t rows = p.local_rows();
      out.push_back(rows == 0 ? at::empty(p.sharded_size(), at::TensorOptions().dtype(flat.dtype()))
                              : flat.local_shard({{flat_offset + p.row_offset(rank_) * p.row_numel()}, {rows * p.row_numel()}, rank_})
                                    .reshape(p.sharded_size()));
      flat_offset += p.numel();
    }
    return out;
  }
  // Sharded another way (another world size): the whole flat value once, then each parameter's rows.
  if (!flat.process_group().is_member())
    throw Error("FSDP unit " + unit_name_ + ": a flat parameter sharded differently from the model needs redistributing, "
                "but this rank is not a member of its process group " + flat.process_group().name());
  at::Tensor full = flat.full_tensor();
  int64_t flat_offset = 0;
  for (const auto& p : params_) {
    out.push_back(p.layout().local_of_full(full.narrow(0, flat_offset, p.numel()).view(p.unsharded_size())));
    flat_offset += p.numel();
  }
  return out;
}

void FSDPParamGroup::drop_pending_unshard() {
  if (gathering_) finish_all_gather(/*keep=*/false);
}

void FSDPParamGroup::reshard() {
  // A gather nobody waited for: finish it so the group stays in step, then drop it.
  drop_pending_unshard();
  drop_post_forward_shard();
  if (!unsharded_) return;
  for (auto& p : params_) p.to_sharded();
  if (full_precision_flat_.defined()) {
    // Views of the compute buffer again (only a buffer with storage can be viewed).
    allocate_unsharded();
    bind_unsharded(unsharded_flat_);
    full_precision_flat_ = at::Tensor();
  }
  free_unsharded();
  unsharded_ = false;
}

bool FSDPParamGroup::post_backward(const std::function<void()>& after_release) {
  profiler::record_function span(profiler::detail::span_name("FSDP::post_backward", trace_name_));
  if (reduce_scatter_output_.defined())
    throw Error("FSDP unit " + unit_name_ + ": a second post-backward before the previous reduce-scatter finished");
  std::vector<at::Tensor> grads(params_.size());
  had_grad_.assign(params_.size(), 0);
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& g = params_[i].param().mutable_grad();
    if (g.defined() && !params_[i].is_sharded()) {
      grads[i] = g;
      g.reset();
      had_grad_[i] = 1;
      any = true;
    }
  }
  at::NoGradGuard no_grad;
  if (accumulated_grads_.empty()) accumulated_grads_.resize(params_.size());
  if (!requires_gradient_sync_) {
    // Summed in the reduce dtype (float32 under a bfloat16 compute policy loses nothing more
    // per microbatch).
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!had_grad_[i]) continue;
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
    grads[i] = had_grad_[i] ? accumulated_grads_[i].add_(grads[i]) : accumulated_grads_[i];
    accumulated_grads_[i] = at::Tensor();
    had_grad_[i] = 1;
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
  reduce_scatter_input_ = reduce_scatter_input(params_, flat_, grads, reduce_options());
  // After packing, which freed the gradients: a gather started here (BACKWARD_POST) lives
  // beside the input alone, and goes ahead of the reduce-scatter on the comm thread.
  try {
    after_release();
  } catch (...) {
    release_storage(reduce_scatter_input_);
    reduce_scatter_input_ = at::Tensor();
    throw;
  }
  reduce_scatter_output_ = at::empty({flat_.shard_numel()}, reduce_options());
  testing_delay(testing_delays().before_reduce_scatter_ms);
  // The input is freed on the comm thread once the exchange is done with it, before the
  // all-gathers queued behind it allocate their outputs.
  reduce_scatter_work_ = detail::reduce_scatter_tensor_then(reduce_scatter_output_, reduce_scatter_input_, ReduceOp::AVG,
                                                            process_group_,
                                                            [input = reduce_scatter_input_] { release_storage(input); });
  if (replicate_group_.defined() && requires_all_reduce_) start_all_reduce();
  return true;
}

void FSDPParamGroup::start_all_reduce() {
  // Issued here, in backward's order, which is the same on every rank; the replicate group's
  // comm thread runs it once the reduce-scatter (issued just before, on the shard group's
  // thread) has finished. Only the all-reduced sum is a gradient: a sum kept while all-reduce
  // was off (FSDP2's partial reduce output) is added to the reduce-scatter output first.
  at::Tensor partial = std::move(partial_reduce_output_);
  partial_reduce_output_ = at::Tensor();
  for (size_t i = 0; i < had_partial_grad_.size(); ++i) had_grad_[i] |= had_partial_grad_[i];
  had_partial_grad_.clear();
  std::function<void()> add_partial;
  if (partial.defined())
    add_partial = [output = reduce_scatter_output_, partial = std::move(partial)] { output.add_(partial); };
  all_reduce_work_ = detail::all_reduce_after(reduce_scatter_work_, reduce_scatter_output_, ReduceOp::AVG,
                                              replicate_group_, std::move(add_partial));
  all_reduce_issued_ = true;
}

void FSDPParamGroup::keep_partial_reduce_output(at::Tensor& output) {
  // Summed here, not in `.grad`: only the all-reduced sum is a gradient. A parameter without a
  // gradient this time added zeros.
  if (partial_reduce_output_.defined()) {
    partial_reduce_output_.add_(output);
    release_storage(output);
  } else {
    partial_reduce_output_ = output;
  }
  had_partial_grad_.resize(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) had_partial_grad_[i] |= had_grad_[i];
}

void FSDPParamGroup::finalize_backward() {
  if (!reduce_scatter_output_.defined()) return;
  profiler::record_function span(profiler::detail::span_name("FSDP::finalize_backward", trace_name_));
  at::Tensor output = std::move(reduce_scatter_output_);
  reduce_scatter_output_ = at::Tensor();
  Work work = std::move(reduce_scatter_work_);
  reduce_scatter_work_ = Work();
  Work all_reduce_work = std::move(all_reduce_work_);
  all_reduce_work_ = Work();
  const bool all_reduced = all_reduce_issued_;
  all_reduce_issued_ = false;
  // A failed reduce-scatter throws here; its all-reduce then fails without running.
  work.wait();
  release_storage(reduce_scatter_input_);
  reduce_scatter_input_ = at::Tensor();
  at::NoGradGuard no_grad;
  if (replicate_group_.defined()) {
    if (!all_reduced) {
      keep_partial_reduce_output(output);
      return;
    }
    all_reduce_work.wait();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!had_grad_[i]) continue;
    at::Tensor shard = gradient_shard(params_, flat_, output, i);
    at::Tensor& grad = params_[i].param().mutable_grad();
    if (grad.defined() && grad.sizes() == shard.sizes()) {
      grad.add_(shard.to(grad.device()));
    } else {
      // Its own storage (optimizers' zero_grad() detaches `.grad` in place, which a view
      // forbids), in the sharded parameter's dtype and beside it (on the host under CPU offload).
      grad = shard.to(sharded_flat_.options(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
  release_storage(output);
}

}  // namespace fsdpp::detail

#include "fsdp/fsdp_collectives.h"

#include <utility>

#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>

#include "comm/chained_collectives.h"
#include "comm/device_stream.h"
#include "comm/process_group_impl.h"
#include "comm/shm_transport.h"
#include "fsdp/storage_memory.h"
#include "fsdp/testing_delays.h"

namespace fsdpp::detail {

namespace {
void wait_quietly(const Work& work) noexcept {
  try {
    work.wait();
  } catch (...) {
  }
}
}  // namespace

// A device's gathers place each rank's block with device copies (comm/device_transport.h),
// whatever the group's transport.
bool gathers_in_place(const ProcessGroup& group, const at::Device& device) {
  return !device.is_cpu() || group.size() == 1 || uses_shared_memory(group);
}

ProcessGroup post_forward_group(const ProcessGroup& group, int k) { return consecutive_subgroup(group, k); }

AllGatherInput all_gather_input(const at::Tensor& sharded_flat, const at::TensorOptions& options) {
  if (!sharded_flat.is_cpu() || options.device().is_cpu()) return {sharded_flat.to(options), {}};
  const at::Tensor input = unallocated(sharded_flat.numel(), options);
  return {input, [input, shards = sharded_flat] {
            allocate_storage(input);
            // A cast in the same copy would be made on the host first (from unpinned memory).
            if (shards.scalar_type() == input.scalar_type())
              input.copy_(shards, /*non_blocking=*/shards.is_pinned());
            else
              input.copy_(shards.to(input.device(), /*non_blocking=*/shards.is_pinned()));
          }};
}

UnitAllGather::~UnitAllGather() {
  if (in_flight_) wait_quietly(work_);
}

void UnitAllGather::start(const at::Tensor& input, const ProcessGroup& group, std::shared_ptr<const GatherLayout> layout,
                          const at::Tensor& target, CommStream& stream, std::function<void()> copy_in) {
  const bool in_place = in_place_ && (any_layout_in_place_ || layout->blocks_per_member == 1);
  testing_delay(testing_delays().before_all_gather_ms);
  // Not in place: rank-major, placed at the wait. The unit computing meanwhile has resharded by
  // then, so that output and the parameters never coexist with it (placed on the comm thread,
  // all three would).
  target_ = target;
  layout_ = std::move(layout);
  rank_major_ = in_place ? at::Tensor() : unallocated(target.numel(), input.options());
  const at::Tensor destination = in_place ? target : rank_major_;
  copies_in_ = static_cast<bool>(copy_in);
  auto allocate = [destination, copy_in = std::move(copy_in)] {
    if (copy_in) copy_in();
    allocate_storage(destination);
  };
  work_ = in_place ? all_gather_into_layout(destination, input, layout_, group, allocate, &stream)
                   : all_gather_into_tensor_prepared(destination, input, group, allocate, &stream);
  in_flight_ = true;
}

void UnitAllGather::finish(bool keep) {
  in_flight_ = false;
  const at::Tensor target = std::exchange(target_, at::Tensor());
  const at::Tensor rank_major = std::exchange(rank_major_, at::Tensor());
  try {
    work_.wait();
    if (keep && rank_major.defined()) {
      allocate_storage(target);
      layout_->place_rank_major(target.data_ptr(), rank_major.data_ptr(), rank_major.element_size());
    }
  } catch (...) {
    if (rank_major.defined()) release_storage(rank_major);
    release_storage(target);
    throw;
  }
  if (rank_major.defined()) release_storage(rank_major);
  if (!keep) release_storage(target);
  // A gather nobody uses (a prefetch dropped at the end of backward) may still be copying the
  // shards in from host memory, which the optimizer is about to write: the host waits for it.
  const bool copied_in = std::exchange(copies_in_, false);
  if (!keep && copied_in && !target.is_cpu())
    current_stream(target.device()).synchronize();
}

at::Tensor gather_unsharded_copy(const at::Tensor& sharded_flat, const UnitFlatLayout& flat,
                                 std::shared_ptr<const GatherLayout> layout, const ProcessGroup& group,
                                 const at::Device& device) {
  at::NoGradGuard no_grad;
  const bool one_rank = flat.world_size() == 1;
  at::Tensor input = sharded_flat.to(device, /*non_blocking=*/false, /*copy=*/one_rank);
  if (one_rank) return input;
  at::Tensor unsharded = at::empty({flat.unsharded_numel()}, input.options());
  all_gather_into_layout(unsharded, input, std::move(layout), group, {}).wait();
  return unsharded;
}

UnitGradientReduce::UnitGradientReduce(ProcessGroup shard, ProcessGroup replicate)
    : shard_group_(std::move(shard)), replicate_group_(std::move(replicate)) {}

UnitGradientReduce::~UnitGradientReduce() {
  if (!output_.defined()) return;
  wait_quietly(reduce_scatter_work_);
  wait_quietly(all_reduce_work_);
}

void UnitGradientReduce::pack(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat,
                              std::vector<at::Tensor>& grads, std::vector<char> had_grad,
                              const at::TensorOptions& reduce_options) {
  at::NoGradGuard no_grad;
  input_ = flat.reduce_scatter_input(params, grads, reduce_options);
  had_grad_ = std::move(had_grad);
}

void UnitGradientReduce::drop_packed() {
  if (input_.defined()) release_storage(input_);
  input_ = at::Tensor();
}

void UnitGradientReduce::issue(const UnitFlatLayout& flat, bool all_reduce, const at::TensorOptions& grad_options,
                               FSDPCommContext& streams) {
  output_ = at::empty({flat.shard_numel()}, input_.options());
  testing_delay(testing_delays().before_reduce_scatter_ms);
  // The input is freed once the exchange is done with it (on the comm thread before the
  // all-gathers queued behind it allocate their outputs; on the device path after the
  // reduce-scatter stream's work so far).
  std::function<void()> done = [input = input_] { release_storage(input); };
  at::Tensor host_output;
  std::shared_ptr<StreamEvent> host_copied;
  if (!replicate_group_.defined() && grad_options.device().is_cpu() && !output_.is_cpu()) {
    host_output = at::empty(output_.sizes(), output_.options().device(at::kCPU).pinned_memory(true));
    host_copied = std::make_shared<StreamEvent>(output_.device().type());
    done = [input = input_, output = output_, host = host_output, copied = host_copied] {
      release_storage(input);
      host.copy_(output, /*non_blocking=*/true);
      copied->record(current_stream(output.device()));
    };
  }
  reduce_scatter_work_ =
      reduce_scatter_tensor_then(output_, input_, ReduceOp::AVG, shard_group_, std::move(done), &streams.reduce_scatter);
  host_output_ = std::move(host_output);
  host_copied_ = std::move(host_copied);
  if (!replicate_group_.defined() || !all_reduce) return;
  // Issued here, in backward's order, which is the same on every rank; it runs once the
  // reduce-scatter issued just before has finished (the replicate group's comm thread waits for
  // it; on the device path the all-reduce stream does). A sum kept while all-reduce was off
  // (FSDP2's partial reduce output) is added to the reduce-scatter output first.
  at::Tensor partial = std::exchange(partial_output_, at::Tensor());
  for (size_t i = 0; i < had_partial_grad_.size(); ++i) had_grad_[i] |= had_partial_grad_[i];
  had_partial_grad_.clear();
  std::function<void()> add_partial;
  // Added on the all-reduce stream once the reduce-scatter is done, and freed after that.
  if (partial.defined())
    add_partial = [output = output_, partial = std::move(partial)] {
      run_on_current_stream(output.device(),
                            [output = kernel_argument(output), partial = kernel_argument(partial)] { output.add_(partial); });
      release_storage(partial);
    };
  all_reduce_work_ = all_reduce_after(reduce_scatter_work_, output_, ReduceOp::AVG, replicate_group_,
                                      std::move(add_partial), &streams.all_reduce);
  all_reduce_issued_ = true;
}

bool UnitGradientReduce::done() const {
  return !replicate_group_.defined() && output_.defined() && reduce_scatter_work_.is_completed();
}

void UnitGradientReduce::keep_partial(at::Tensor& output) {
  // A parameter without a gradient this time added zeros.
  if (partial_output_.defined()) {
    partial_output_.add_(output);
    release_storage(output);
  } else {
    partial_output_ = output;
  }
  had_partial_grad_.resize(had_grad_.size(), 0);
  for (size_t i = 0; i < had_grad_.size(); ++i) had_partial_grad_[i] |= had_grad_[i];
}

void UnitGradientReduce::finish(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat,
                                const at::TensorOptions& grad_options) {
  if (!output_.defined()) return;
  at::Tensor output = std::exchange(output_, at::Tensor());
  const Work reduce_scatter_work = std::exchange(reduce_scatter_work_, Work());
  const Work all_reduce_work = std::exchange(all_reduce_work_, Work());
  const bool all_reduced = std::exchange(all_reduce_issued_, false);
  at::Tensor host_output = std::exchange(host_output_, at::Tensor());
  const std::shared_ptr<StreamEvent> host_copied = std::exchange(host_copied_, nullptr);
  // A failed reduce-scatter throws here; its all-reduce then fails without running.
  reduce_scatter_work.wait();
  drop_packed();
  // CPU offload: the host waits for this unit's copy only (its gradients are read here).
  if (host_copied) {
    host_copied->synchronize();
    release_storage(output);
    output = host_output;
  }
  at::NoGradGuard no_grad;
  if (replicate_group_.defined()) {
    if (!all_reduced) {
      keep_partial(output);
      return;
    }
    all_reduce_work.wait();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!had_grad_[i]) continue;
    at::Tensor shard = flat.gradient_shard(params, output, i);
    at::Tensor& grad = params[i].param().mutable_grad();
    if (grad.defined() && grad.sizes() == shard.sizes()) {
      grad.add_(shard.to(grad.device()));
    } else {
      // Its own storage (optimizers' zero_grad() detaches `.grad` in place, which a view
      // forbids), in the sharded parameter's dtype and beside it (on the host under CPU offload).
      grad = shard.to(grad_options, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  release_storage(output);
}

}  // namespace fsdpp::detail

#pragma once
// The collectives of one FSDP unit (FSDP2's _fsdp_collectives: foreach_all_gather with its
// copy-in and copy-out, foreach_reduce): issuing them over the unit's flat buffers
// (unit_flat_layout), waiting for them, placing what arrived, and writing the gradient shards
// into `.grad`. FSDPParamGroup decides when each runs and passes the streams they run on (its
// tree's FSDPCommContext). Whether a gather puts each rank's chunks straight into the unsharded
// flat or goes through a rank-major buffer is decided here (gathers_in_place) and nowhere else;
// the transport and the stream a collective takes are src/comm's (comm/device_handoff makes the
// context's streams on first use and runs each collective on the one it is given).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

#include "comm/device_stream.h"
#include "comm/gather_layout.h"
#include "fsdp/fsdp_comm_context.h"
#include "fsdp/fsdp_param.h"
#include "fsdp/unit_flat_layout.h"

namespace fsdpp::detail {

// Whether a unit's all-gathers over `group` put each rank's chunks straight into the unsharded
// flat: over shared memory (the peers' bytes are placed from the segment) and on one rank. Over
// Gloo a peer's block is one message, so the gather goes through a rank-major output placed at
// the wait. Decided once per unit, after its first collective settled the group's transport.
bool gathers_in_place(const ProcessGroup& group, const at::Device& device);
// The k-rank post-forward group of reshard_after_forward = k: consecutive ranks of `group`.
ProcessGroup post_forward_group(const ProcessGroup& group, int k);

// A gather's input made from the unit's sharded flat in `options` (the dtype it moves, on the
// compute device). A cast or copy made now, except from host memory (CPU offload) to an
// accelerator: then memory that `copy_in` fills within the gather's launch, on the all-gather
// stream (FSDP2's copy-in; non-blocking from pinned memory), not on the compute stream.
struct AllGatherInput {
  at::Tensor input;
  std::function<void()> copy_in;  // empty unless copied in from the host
};
AllGatherInput all_gather_input(const at::Tensor& sharded_flat, const at::TensorOptions& options);

// A unit's all-gathers: the path they take, and the one in flight.
class UnitAllGather {
 public:
  UnitAllGather() = default;
  UnitAllGather(const UnitAllGather&) = delete;
  UnitAllGather& operator=(const UnitAllGather&) = delete;
  ~UnitAllGather();

  // Chooses the path of the gathers of sharded flats over the unit's `group` into `device`
  // (gathers_in_place); called once its first collective settled the group's transport.
  void choose_path(const ProcessGroup& group, const at::Device& device) {
    in_place_ = gathers_in_place(group, device);
    any_layout_in_place_ = !device.is_cpu();
  }
  // Starts gathering `input` over `group` into `target` (layout.ranks blocks), whose memory is
  // allocated when the exchange starts (on the comm thread over a host transport, so that a
  // prefetch queued behind a reduce-scatter does not coexist with that reduce-scatter's input;
  // at the launch on the device path under NCCL, as FSDP2 does). In place (the path chosen,
  // for a gather of one sharded flat per rank): each rank's chunks go straight to their places;
  // otherwise (a k-way post-forward shard: several flats per member) into a rank-major output
  // placed by finish(). `copy_in`, if any, fills `input` first, within the gather's launch
  // (all_gather_input). On the device path the gather runs on `stream`.
  void start(const at::Tensor& input, const ProcessGroup& group, std::shared_ptr<const GatherLayout> layout,
             const at::Tensor& target, CommStream& stream, std::function<void()> copy_in = {});
  bool in_flight() const { return in_flight_; }
  // Waits and, with `keep`, places a rank-major output into the target. Without `keep`, or if
  // the gather failed (rethrown), frees the target's memory.
  void finish(bool keep);

 private:
  bool in_place_ = false;
  bool any_layout_in_place_ = false;  // a device places each block with a copy of its own
  bool copies_in_ = false;            // the gather in flight reads host memory (CPU offload)
  Work work_;
  bool in_flight_ = false;
  at::Tensor target_;
  at::Tensor rank_major_;  // when not in place
  std::shared_ptr<const GatherLayout> layout_;
};

// Every parameter's full value, gathered into one new unsharded flat over `group` (state dicts;
// blocking). On one rank, a copy of the sharded flat.
at::Tensor gather_unsharded_copy(const at::Tensor& sharded_flat, const UnitFlatLayout& flat,
                                 std::shared_ptr<const GatherLayout> layout, const ProcessGroup& group,
                                 const at::Device& device);

// A unit's gradient reduction (FSDP2's foreach_reduce): the reduce-scatter of the gradients'
// average over the shard group and, under HSDP, the average of its output across the replicas,
// chained after it on the comm threads so that backward's compute overlaps both; then each
// parameter's gradient shard into `.grad`.
class UnitGradientReduce {
 public:
  // `replicate` is defined (of more than one rank) under HSDP only.
  UnitGradientReduce(ProcessGroup shard, ProcessGroup replicate);
  UnitGradientReduce(const UnitGradientReduce&) = delete;
  UnitGradientReduce& operator=(const UnitGradientReduce&) = delete;
  ~UnitGradientReduce();

  // Packs the full gradients into the reduce-scatter input (each handle released once packed).
  // had_grad[i]: parameter i has a gradient to write.
  void pack(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, std::vector<at::Tensor>& grads,
            std::vector<char> had_grad, const at::TensorOptions& reduce_options);
  // Frees a packed input that will not be issued.
  void drop_packed();
  // Issues the reduce-scatter of the packed input; with `all_reduce` (HSDP) also the replicate
  // all-reduce of its output, to which a sum kept while all-reduce was off is added first.
  // Gradients that live on the host while an accelerator reduces them (CPU offload, `grad_options`)
  // are copied back on the reduce-scatter's stream right after it, into pinned memory, without
  // blocking (FSDP2's post-reduce copy; not under HSDP, where finish() copies them). On the
  // device path the reduce-scatter runs on `streams.reduce_scatter`, the all-reduce on
  // `streams.all_reduce`.
  void issue(const UnitFlatLayout& flat, bool all_reduce, const at::TensorOptions& grad_options,
             FSDPCommContext& streams);
  // Issued and not yet finished by finish().
  bool pending() const { return output_.defined(); }
  // Finished on the wire, so finish() will not block. Never under HSDP: there the end of
  // backward waits for the reduce-scatter and its all-reduce, so that a failed all-reduce throws
  // at the same point on every rank.
  bool done() const;
  // Waits and writes (or adds to) each parameter's gradient shard in `.grad`, a tensor of its own
  // in `grad_options` (the sharded parameters' dtype and device). Under HSDP without all-reduce,
  // keeps the output (summed over backwards) instead: only the all-reduced sum is a gradient.
  void finish(const std::vector<FSDPParam>& params, const UnitFlatLayout& flat, const at::TensorOptions& grad_options);

 private:
  void keep_partial(at::Tensor& output);

  ProcessGroup shard_group_;
  ProcessGroup replicate_group_;
  at::Tensor input_;
  at::Tensor output_;
  std::vector<char> had_grad_;
  Work reduce_scatter_work_;
  Work all_reduce_work_;
  bool all_reduce_issued_ = false;
  at::Tensor partial_output_;  // HSDP without all-reduce: reduce-scatter outputs, summed
  // CPU offload: the output's copy in pinned host memory, complete once `host_copied_` is.
  at::Tensor host_output_;
  std::shared_ptr<StreamEvent> host_copied_;
  std::vector<char> had_partial_grad_;
};

}  // namespace fsdpp::detail

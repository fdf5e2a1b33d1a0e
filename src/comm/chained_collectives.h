#pragma once
// Collectives with work hooked onto their group's comm thread: an all-reduce started only once a
// collective of another group has finished (FSDP's replicate all-reduce of a gradient shard,
// chained after the unit's reduce-scatter, as FSDP2's foreach_reduce waits for the
// reduce-scatter stream), and FSDP's all-gather (into its parameters' layout) and reduce-scatter
// whose buffers live only while the comm thread runs them. On the device path each runs on the
// stream its caller names (FSDP's comm context: FSDP2's all-gather, reduce-scatter and all-reduce
// streams), else on the group's. Private to fsdpp.
#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

#include <fsdpp/collectives.h>
#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

#include "comm/device_stream.h"
#include "comm/gather_layout.h"

namespace fsdpp::detail {

// all_reduce(tensor, op, group, /*async_op=*/true), issued now (numbered, counted by
// CommDebugMode, recorded by the profiler as issued here), except that `group`'s comm thread
// first waits for `after` and then runs `prepare` (if any) before the exchange. `after` must
// have been issued before this call (so that no two comm threads can wait on each other) and
// `tensor` may be its output. If `after` failed, the all-reduce is not run and its Work fails
// with "<all_reduce description> not run: <after's error>"; a failure of the all-reduce itself
// reads as a synchronous all_reduce's would.
Work all_reduce_after(const Work& after, const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group,
                      std::function<void()> prepare = {}, CommStream* stream = nullptr);

// all_gather_into_tensor(output, input, group, /*async_op=*/true) (rank-major), except that the
// comm thread runs `prepare` right before the exchange: FSDP allocates `output`'s memory there,
// so a prefetch's buffer does not exist while the collectives queued before it still hold
// theirs. `output` only needs its sizes until then.
Work all_gather_into_tensor_prepared(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                                     std::function<void()> prepare, CommStream* stream = nullptr);
// The same, except that each rank's input lands where `layout` (not null) puts it: FSDP's
// unsharded parameter-major layout. Counted, numbered and checked as all_gather_into_tensor.
Work all_gather_into_layout(const at::Tensor& output, const at::Tensor& input, std::shared_ptr<const GatherLayout> layout,
                            const ProcessGroup& group, std::function<void()> prepare, CommStream* stream = nullptr);

// reduce_scatter_tensor(output, input, op, group, /*async_op=*/true), except that the comm thread
// runs `done` as soon as the exchange no longer reads `input` (FSDP frees it there), before the
// Work completes. `done` does not run if the exchange failed.
Work reduce_scatter_tensor_then(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                const ProcessGroup& group, std::function<void()> done, CommStream* stream = nullptr);

}  // namespace fsdpp::detail

#pragma once
// Collectives that their group's comm thread starts only once a collective of another group
// has finished: FSDP's replicate all-reduce of a gradient shard, chained after the unit's
// reduce-scatter (FSDP2's foreach_reduce issues it on the all-reduce stream after waiting for
// the reduce-scatter stream). Private to fsdpp.
#include <functional>

#include <ATen/core/Tensor.h>

#include <fsdpp/collectives.h>
#include <fsdpp/process_group.h>
#include <fsdpp/work.h>

namespace fsdpp::detail {

// all_reduce(tensor, op, group, /*async_op=*/true), issued now (numbered, counted by
// CommDebugMode, recorded by the profiler as issued here), except that `group`'s comm thread
// first waits for `after` and then runs `prepare` (if any) before the exchange. `after` must
// have been issued before this call (so that no two comm threads can wait on each other) and
// `tensor` may be its output. If `after` failed, the all-reduce is not run and its Work fails
// with "<all_reduce description> not run: <after's error>"; a failure of the all-reduce itself
// reads as a synchronous all_reduce's would.
Work all_reduce_after(const Work& after, const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group,
                      std::function<void()> prepare = {});

}  // namespace fsdpp::detail

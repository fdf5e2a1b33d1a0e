#pragma once
// c10d::ProcessGroup's (and c10d::Backend's) single-tensor all-gather and reduce-scatter: `_allgather_base` and
// `_reduce_scatter_base` in 2.6, renamed `all_gather_single` / `reduce_scatter_single` in 2.15
// (the old names deprecated). The new name is used where it exists.
#include <utility>

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

namespace fsdpp::compat {

// Since 2.7 `asyncOp = false` makes ProcessGroupNCCL launch on the caller's current stream and
// return a null Work; before, the field (where the options have it) only changed how NCCL kept
// the tensors alive.
inline constexpr bool kAsyncOpChoosesTheStream =
    TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 7);

namespace detail {

template <typename Group>
auto all_gather_single(Group& g, at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& options, int)
    -> decltype(g.all_gather_single(out, in, options)) {
  return g.all_gather_single(out, in, options);
}
template <typename Group>
auto all_gather_single(Group& g, at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& options, long) {
  return g._allgather_base(out, in, options);
}

template <typename Group>
auto reduce_scatter_single(Group& g, at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& options, int)
    -> decltype(g.reduce_scatter_single(out, in, options)) {
  return g.reduce_scatter_single(out, in, options);
}
template <typename Group>
auto reduce_scatter_single(Group& g, at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& options,
                           long) {
  return g._reduce_scatter_base(out, in, options);
}

template <typename Options>
auto queue_on_current_stream(Options& options, int) -> decltype(void(options.asyncOp = false)) {
  options.asyncOp = false;
}
template <typename Options>
void queue_on_current_stream(Options&, long) {}

template <typename Options>
auto asks_current_stream(const Options& options, int) -> decltype(bool(options.asyncOp)) {
  return kAsyncOpChoosesTheStream && !options.asyncOp;
}
template <typename Options>
bool asks_current_stream(const Options&, long) {
  return false;
}

}  // namespace detail

inline c10::intrusive_ptr<c10d::Work> all_gather_single(c10d::ProcessGroup& g, at::Tensor& out, at::Tensor& in) {
  return detail::all_gather_single(g, out, in, c10d::AllgatherOptions(), 0);
}
inline c10::intrusive_ptr<c10d::Work> reduce_scatter_single(c10d::ProcessGroup& g, at::Tensor& out, at::Tensor& in) {
  return detail::reduce_scatter_single(g, out, in, c10d::ReduceScatterOptions(), 0);
}

// The same on one backend (fsdpp's device collectives call the backend, not the dispatcher).
inline c10::intrusive_ptr<c10d::Work> all_gather_single(c10d::Backend& b, at::Tensor& out, at::Tensor& in,
                                                        const c10d::AllgatherOptions& options) {
  return detail::all_gather_single(b, out, in, options, 0);
}
inline c10::intrusive_ptr<c10d::Work> reduce_scatter_single(c10d::Backend& b, at::Tensor& out, at::Tensor& in,
                                                            const c10d::ReduceScatterOptions& options) {
  return detail::reduce_scatter_single(b, out, in, options, 0);
}

// Options asking ProcessGroupNCCL to run on the caller's current stream (`asyncOp = false`, as
// FSDP2's collectives inside its stream contexts) instead of its own internal one, which would
// put every collective of a group behind one stream. Before 2.7 (2.6) the field, where the options
// have it (not AllreduceOptions, AllToAllOptions), only makes NCCL stash the tensors instead of
// recordStream: NCCL keeps its own stream, which waits for the current one, and the Work's wait
// orders the current stream after it. Correct either way; only 2.7+ overlaps a group's kinds.
template <typename Options>
void queue_on_current_stream(Options& options) {
  detail::queue_on_current_stream(options, 0);
}

// Whether `options` ask a backend with NCCL's contract to launch on the caller's current stream
// (and return a null Work): what the NCCL-contract double reads.
template <typename Options>
bool asks_current_stream(const Options& options) {
  return detail::asks_current_stream(options, 0);
}

}  // namespace fsdpp::compat

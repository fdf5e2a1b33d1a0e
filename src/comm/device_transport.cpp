// comm/device_transport.h: device collectives' exchanges over NCCL (or its contract double) and
// Gloo, with each one's dtype rules, on the collective's stream.
#include "comm/device_transport.h"

#include <string>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <fsdpp/error.h>

#include "comm/device_stream.h"
#include "comm/process_group_impl.h"
#include "comm/transport_dtypes.h"
#include "compat/c10d_tensor_collectives.h"

namespace fsdpp::detail {
namespace {

compat::C10dBackend& device_backend(const ProcessGroupImpl& g, const at::Tensor& t) {
  if (!g.device_backend)
    throw Error("no backend of " + g.where() + " takes " + t.device().str() + " tensors (backend '" + g.backend_name +
                "')");
  return *g.device_backend;
}

// NCCL's contract (ProcessGroupNCCL or its double) rather than Gloo's staging of device tensors.
bool over_nccl(const ProcessGroupImpl& g) { return g.device_launches_on_issue; }

at::Tensor wire(const ProcessGroupImpl& g, const at::Tensor& t) { return over_nccl(g) ? as_nccl_wire(t) : as_wire(t); }

at::ScalarType reduced_in(const ProcessGroupImpl& g, at::ScalarType t) {
  return (over_nccl(g) ? nccl_can_reduce(t) : gloo_can_reduce(t)) ? t : widened(t);
}

// NCCL averages itself (ncclAvg: a half-precision average rounded once, as FSDP2 reduces on
// NCCL); over Gloo AVG is a sum divided afterwards.
bool divides_itself(const ProcessGroupImpl& g, ReduceOp op) { return over_nccl(g) && op == ReduceOp::AVG; }

c10d::ReduceOp c10d_op(const ProcessGroupImpl& g, ReduceOp op) {
  return divides_itself(g, op) ? c10d::ReduceOp(c10d::ReduceOp::AVG) : to_c10d(op);
}

// A collective's c10d options: the group's timeout, and under NCCL the current stream (the
// collective's) rather than ProcessGroupNCCL's own.
template <typename Options>
Options options_for(const ProcessGroupImpl& g) {
  Options options;
  options.timeout = g.timeout;
  if (over_nccl(g)) compat::queue_on_current_stream(options);
  return options;
}

// A null Work is NCCL's answer under asyncOp = false: the collective is already ordered on the
// current stream (2.15's distributed_c10d.py: "the backend has sync'ed at CPP level"). NCCL's
// Work waits by ordering the current stream (its timeout is the watchdog's); Gloo's on the host.
void wait(const ProcessGroupImpl& g, const c10::intrusive_ptr<c10d::Work>& work) {
  if (!work) return;
  if (over_nccl(g))
    work->wait();
  else
    work->wait(g.timeout);
}

// `work` on the collective's stream after the exchange (or before it); what it captures of a
// caller's tensor is a kernel_argument.
void on_stream(const at::Tensor& t, std::function<void()> work) { run_on_current_stream(t.device(), std::move(work)); }

at::Tensor empty_flat(int64_t numel, const at::Tensor& like, at::ScalarType dtype) {
  return at::empty({numel}, like.options().dtype(dtype));
}

}  // namespace

void run_device_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op) {
  const at::ScalarType dtype = reduced_in(g, tensor.scalar_type());
  if (dtype != tensor.scalar_type()) {
    const at::Tensor wide = empty_flat(tensor.numel(), tensor, dtype), flat = kernel_argument(tensor.reshape({-1}));
    on_stream(tensor, [wide, flat] { wide.copy_(flat); });
    run_device_all_reduce(g, wide, op);
    on_stream(tensor, [wide, flat] { flat.copy_(wide); });
    return;
  }
  std::vector<at::Tensor> tensors{tensor};
  auto options = options_for<c10d::AllreduceOptions>(g);
  options.reduceOp = c10d_op(g, op);
  wait(g, device_backend(g, tensor).allreduce(tensors, options));
  if (op == ReduceOp::AVG && !divides_itself(g, op)) on_stream(tensor, [t = kernel_argument(tensor), n = g.size()] { t.div_(n); });
}

void run_device_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank) {
  std::vector<at::Tensor> tensors{wire(g, tensor)};
  auto options = options_for<c10d::BroadcastOptions>(g);
  options.rootRank = root_group_rank;
  wait(g, device_backend(g, tensor).broadcast(tensors, options));
}

void run_device_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input) {
  at::Tensor out = wire(g, output), in = wire(g, input);
  wait(g, compat::all_gather_single(device_backend(g, input), out, in, options_for<c10d::AllgatherOptions>(g)));
}

void run_device_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                       const GatherLayout& layout) {
  const at::Tensor gathered = at::empty({output.numel()}, input.options());
  run_device_all_gather(g, gathered, input);
  // One strided copy per piece: rank v's run of it goes to GatherLayout::rank_output_offset(piece, v).
  on_stream(output, [gathered, out = kernel_argument(output.reshape({-1})), layout] {
    const at::Tensor by_rank = gathered.view({layout.ranks, layout.block_numel});
    for (const auto& piece : layout.pieces) {
      const int64_t first = GatherLayout::rank_output_offset(piece, 0);
      const int64_t stride = GatherLayout::rank_output_offset(piece, 1) - first;
      out.narrow(0, first, layout.ranks * stride)
          .view({layout.ranks, stride})
          .narrow(1, 0, piece.numel)
          .copy_(by_rank.narrow(1, piece.input_offset, piece.numel));
    }
  });
}

void run_device_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op) {
  if (!over_nccl(g)) {
    // Gloo's own reduce-scatter of CUDA tensors is an all-reduce of the whole input anyway, and
    // in some releases drops the op (MIN and MAX summed) and the timeout: an all-reduce of a copy.
    const at::Tensor whole = empty_flat(input.numel(), input, input.scalar_type());
    const at::Tensor in = kernel_argument(input.reshape({-1}));
    on_stream(input, [whole, in] { whole.copy_(in); });
    run_device_all_reduce(g, whole, op);
    on_stream(output, [whole, out = kernel_argument(output.reshape({-1})), rank = g.rank] {
      out.copy_(whole.narrow(0, rank * out.numel(), out.numel()));
    });
    return;
  }
  const at::ScalarType dtype = reduced_in(g, input.scalar_type());
  if (dtype != input.scalar_type()) {
    const at::Tensor wide_in = empty_flat(input.numel(), input, dtype), in = kernel_argument(input.reshape({-1}));
    const at::Tensor wide_out = empty_flat(output.numel(), output, dtype), out = kernel_argument(output.reshape({-1}));
    on_stream(input, [wide_in, in] { wide_in.copy_(in); });
    run_device_reduce_scatter(g, wide_out, wide_in, op);
    // Holds wide_in too: a temporary lives until its stream has passed the exchange reading it
    // (on a device the caching allocator orders its reuse on that stream; a CPU's frees at once).
    on_stream(output, [wide_in, wide_out, out] { out.copy_(wide_out); });
    return;
  }
  at::Tensor out = output.reshape({-1}), in = input.reshape({-1});
  auto options = options_for<c10d::ReduceScatterOptions>(g);
  options.reduceOp = c10d_op(g, op);
  wait(g, compat::reduce_scatter_single(device_backend(g, input), out, in, options));
  if (op == ReduceOp::AVG && !divides_itself(g, op)) on_stream(output, [out = kernel_argument(out), n = g.size()] { out.div_(n); });
}

void run_device_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_elements, const std::vector<int64_t>& input_elements) {
  at::Tensor out = wire(g, output), in = wire(g, input);
  // Split sizes in elements of the wire dtype (bytes when NCCL moves the tensor as bytes).
  const int64_t scale = out.element_size() == output.element_size() ? 1 : output.element_size();
  std::vector<int64_t> out_splits = output_elements, in_splits = input_elements;
  for (auto& s : out_splits) s *= scale;
  for (auto& s : in_splits) s *= scale;
  auto options = options_for<c10d::AllToAllOptions>(g);
  wait(g, device_backend(g, input).alltoall_base(out, in, out_splits, in_splits, options));
}

}  // namespace fsdpp::detail

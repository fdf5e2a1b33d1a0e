// comm/device_collectives.h: accelerator tensors' collectives through the group's device backend,
// under the group's device stream.
#include "comm/device_collectives.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <fsdpp/error.h>

#include "comm/collective_algorithms.h"
#include "comm/process_group_impl.h"
#include "compat/c10d_tensor_collectives.h"

namespace fsdpp::detail {
namespace {

compat::C10dBackend& device_backend(const ProcessGroupImpl& g, const at::Tensor& t) {
  if (!g.device_backend)
    throw Error("no backend of " + g.where() + " takes " + t.device().str() + " tensors (backend '" + g.backend_name +
                "')");
  return *g.device_backend;
}

// The group's stream on `device`, made (at high priority, as FSDP2's communication streams) the
// first time; only the comm thread touches it.
c10::Stream device_stream(const ProcessGroupImpl& g, c10::Device device) {
  if (!g.device_stream || g.device_stream->device() != device)
    g.device_stream = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  return *g.device_stream;
}

// Under "gloo" the device backend is the CPU one, which stages CUDA tensors through host memory
// and has the same limits as on the CPU: it reduces neither bfloat16 nor int16 (fsdpp's CPU
// collectives sum bfloat16 in float32 and round once, as done here), and moves only the dtypes
// as_wire maps to.
bool over_gloo(const ProcessGroupImpl& g) { return g.device_backend == g.backend; }

// The dtype a reduction over Gloo runs in: the tensor's own where Gloo reduces it.
at::ScalarType reduced_in(const ProcessGroupImpl& g, const at::Tensor& t) {
  if (!over_gloo(g) || gloo_can_reduce(t.scalar_type())) return t.scalar_type();
  return at::isFloatingType(t.scalar_type()) ? at::kFloat : at::kLong;
}

// NCCL's timeout is its watchdog's (ProcessGroupNCCL's options): a wait with a timeout would
// poll the host; Gloo's waits take the group's.
void wait(const ProcessGroupImpl& g, const c10::intrusive_ptr<c10d::Work>& work) {
  if (over_gloo(g))
    work->wait(g.timeout);
  else
    work->wait();
}

}  // namespace

DeviceHandoff DeviceHandoff::at_issue(const at::Tensor& t) {
  DeviceHandoff handoff;
  if (!on_device(t)) return handoff;
  const c10::Stream current = c10::impl::VirtualGuardImpl(t.device().type()).getStream(t.device());
  handoff.issued_ = std::make_shared<c10::Event>(t.device().type());
  handoff.issued_->record(current);
  return handoff;
}

void DeviceHandoff::run(const ProcessGroupImpl& g, const std::function<void()>& run) const {
  if (!issued_) return run();
  const c10::Stream stream = device_stream(g, issued_->device());
  c10::StreamGuard current(stream);
  issued_->block(stream);
  run();
  stream.synchronize();
}

void run_device_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op) {
  const at::ScalarType dtype = reduced_in(g, tensor);
  if (dtype != tensor.scalar_type()) {
    const at::Tensor wide = tensor.to(dtype);
    run_device_all_reduce(g, wide, op);
    tensor.copy_(wide);
    return;
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  options.timeout = g.timeout;
  wait(g, device_backend(g, tensor).allreduce(tensors, options));
  if (op == ReduceOp::AVG) tensor.div_(g.size());
}

void run_device_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank) {
  std::vector<at::Tensor> tensors{over_gloo(g) ? as_wire(tensor) : tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root_group_rank;
  options.timeout = g.timeout;
  wait(g, device_backend(g, tensor).broadcast(tensors, options));
}

void run_device_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input) {
  at::Tensor out = over_gloo(g) ? as_wire(output) : output.reshape({-1});
  at::Tensor in = over_gloo(g) ? as_wire(input) : input.reshape({-1});
  wait(g, compat::all_gather_single(device_backend(g, input), out, in));
}

void run_device_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                       const GatherLayout& layout) {
  const at::Tensor gathered = at::empty({output.numel()}, input.options());
  run_device_all_gather(g, gathered, input);
  // One strided copy per piece: rank v's run of it goes to output_offset + v * numel.
  const at::Tensor by_rank = gathered.view({layout.ranks, layout.block_numel});
  const at::Tensor out = output.reshape({-1});
  for (const auto& piece : layout.pieces)
    out.narrow(0, piece.output_offset, layout.ranks * piece.numel)
        .view({layout.ranks, piece.numel})
        .copy_(by_rank.narrow(1, piece.input_offset, piece.numel));
}

void run_device_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op) {
  if (over_gloo(g)) {
    // Gloo's own reduce-scatter of CUDA tensors is an all-reduce of the whole input anyway, and
    // in some releases drops the op (MIN and MAX summed) and the timeout: an all-reduce of a copy.
    const at::Tensor whole = input.reshape({-1}).clone();
    run_device_all_reduce(g, whole, op);
    output.reshape({-1}).copy_(whole.narrow(0, g.rank * output.numel(), output.numel()));
    return;
  }
  at::Tensor out = output.reshape({-1}), in = input.reshape({-1});
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  options.timeout = g.timeout;
  wait(g, compat::reduce_scatter_single(device_backend(g, input), out, in, options));
  if (op == ReduceOp::AVG) output.div_(g.size());
}

void run_device_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_elements, const std::vector<int64_t>& input_elements) {
  at::Tensor out = over_gloo(g) ? as_wire(output) : output.reshape({-1});
  at::Tensor in = over_gloo(g) ? as_wire(input) : input.reshape({-1});
  std::vector<int64_t> out_splits = output_elements, in_splits = input_elements;
  wait(g, device_backend(g, input).alltoall_base(out, in, out_splits, in_splits));
}

}  // namespace fsdpp::detail

// comm/device_collectives.h: accelerator tensors' collectives through the group's device backend,
// under the group's device stream.
#include "comm/device_collectives.h"

#include <cstdlib>
#include <string>

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

// FSDP2's stream roles: all-gathers, reduce-scatters, and all-reduces (HSDP's) with the rest.
int stream_role(CollectiveKind kind) {
  switch (kind) {
    case kAllGather: return 0;
    case kReduceScatter: return 1;
    default: return 2;
  }
}

// The group's stream for `kind` on `device`, made (at high priority, as FSDP2's communication
// streams) the first time; only the comm thread touches them.
c10::Stream device_stream(const ProcessGroupImpl& g, CollectiveKind kind, c10::Device device) {
  std::optional<c10::Stream>& stream = g.device_streams[stream_role(kind)];
  if (!stream || stream->device() != device)
    stream = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device, /*isHighPriority=*/true);
  return *stream;
}

// Set while a comm thread runs a collective (DeviceHandoff::run).
thread_local bool on_comm_stream = false;

// PyTorch's switch for c10d's NCCL Work (read once, as c10d does).
bool blocking_wait() {
  static const bool blocking = [] {
    const char* v = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
    return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
  }();
  return blocking;
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

// A collective's c10d options: the group's timeout, and under NCCL the current stream (the
// group's stream for its kind) rather than ProcessGroupNCCL's own.
template <typename Options>
Options options_for(const ProcessGroupImpl& g) {
  Options options;
  options.timeout = g.timeout;
  if (!over_gloo(g)) compat::queue_on_current_stream(options);
  return options;
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

DeviceCompletion::~DeviceCompletion() {
  if (tensors_.empty()) return;
  try {
    done_.synchronize();
  } catch (...) {  // a failed device: nothing left to protect
  }
}

void DeviceCompletion::record(const c10::Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  done_.record(stream);
}

void DeviceCompletion::wait_on_current_stream() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_.was_marked_for_recording()) return;  // never queued
  // Every wait orders its own stream (a second waiter's too), as c10d's NCCL Work.
  done_.block(c10::impl::VirtualGuardImpl(done_.device_type()).getStream(done_.device()));
  // A comm thread waiting for the collective a chained one runs after orders only its own
  // stream: the tensors' blocks could go back to the streams they came from, which are not.
  if (!on_comm_stream) tensors_.clear();
}

bool DeviceCompletion::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return !done_.was_marked_for_recording() || done_.query();
}

DeviceHandoff DeviceHandoff::at_issue(CollectiveKind kind, std::vector<at::Tensor> tensors) {
  DeviceHandoff handoff;
  if (tensors.empty() || !on_device(tensors.front())) return handoff;
  const c10::Device device = tensors.front().device();
  const c10::Stream current = c10::impl::VirtualGuardImpl(device.type()).getStream(device);
  handoff.kind_ = kind;
  handoff.issued_ = std::make_shared<c10::Event>(device.type());
  handoff.issued_->record(current);
  handoff.completion_ = std::make_shared<DeviceCompletion>(device.type(), std::move(tensors));
  return handoff;
}

void DeviceHandoff::run(const ProcessGroupImpl& g, const std::function<void()>& run) const {
  struct OnCommStream {
    OnCommStream() { on_comm_stream = true; }
    ~OnCommStream() { on_comm_stream = false; }
  } on_comm;
  if (!issued_) return run();
  const c10::Stream stream = device_stream(g, kind_, issued_->device());
  c10::StreamGuard current(stream);
  issued_->block(stream);
  try {
    run();
  } catch (...) {
    // What it queued before failing may still run: the held tensors wait for it.
    completion_->record(stream);
    throw;
  }
  completion_->record(stream);
  if (blocking_wait()) stream.synchronize();
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
  auto options = options_for<c10d::AllreduceOptions>(g);
  options.reduceOp = to_c10d(op);
  wait(g, device_backend(g, tensor).allreduce(tensors, options));
  if (op == ReduceOp::AVG) tensor.div_(g.size());
}

void run_device_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank) {
  std::vector<at::Tensor> tensors{over_gloo(g) ? as_wire(tensor) : tensor};
  auto options = options_for<c10d::BroadcastOptions>(g);
  options.rootRank = root_group_rank;
  wait(g, device_backend(g, tensor).broadcast(tensors, options));
}

void run_device_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input) {
  at::Tensor out = over_gloo(g) ? as_wire(output) : output.reshape({-1});
  at::Tensor in = over_gloo(g) ? as_wire(input) : input.reshape({-1});
  wait(g, compat::all_gather_single(device_backend(g, input), out, in, options_for<c10d::AllgatherOptions>(g)));
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
  auto options = options_for<c10d::ReduceScatterOptions>(g);
  options.reduceOp = to_c10d(op);
  wait(g, compat::reduce_scatter_single(device_backend(g, input), out, in, options));
  if (op == ReduceOp::AVG) output.div_(g.size());
}

void run_device_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                           const std::vector<int64_t>& output_elements, const std::vector<int64_t>& input_elements) {
  at::Tensor out = over_gloo(g) ? as_wire(output) : output.reshape({-1});
  at::Tensor in = over_gloo(g) ? as_wire(input) : input.reshape({-1});
  std::vector<int64_t> out_splits = output_elements, in_splits = input_elements;
  auto options = options_for<c10d::AllToAllOptions>(g);
  wait(g, device_backend(g, input).alltoall_base(out, in, out_splits, in_splits, options));
}

}  // namespace fsdpp::detail

// The algorithms of comm/collective_algorithms.h: which transport carries a collective and, on
// Gloo, fsdpp's ring reduce-scatter (half the bytes of all-reduce-then-slice), its
// point-to-point all-gather and the float32 reductions of half precision; on shared memory, the
// reductions that keep Gloo's order of sums.
#include "comm/collective_algorithms.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "comm/device_handoff.h"
#include "comm/device_transport.h"
#include "comm/fake_backend.h"
#include "comm/gloo_ring_order.h"
#include "comm/process_group_impl.h"
#include "comm/shm_transport.h"
#include "comm/transport_dtypes.h"

namespace fsdpp::detail {
namespace {

void wait_all(const ProcessGroupImpl& g, std::vector<c10::intrusive_ptr<c10d::Work>>& works) {
  for (auto& w : works) w->wait(g.timeout);
}

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Sums (or min/max) the group's chunks, laid out [size, chunk] in `parts`, into `out`.
// Half precision sums in float32 so that a bf16 reduction loses no more than its storage.
void reduce_chunks(const at::Tensor& parts, const at::Tensor& out, ReduceOp op, int size) {
  at::Tensor flat_out = out.reshape({-1});
  at::Tensor p = is_half(parts.scalar_type()) ? parts.to(at::kFloat) : parts;
  at::Tensor reduced;
  switch (op) {
    case ReduceOp::SUM: reduced = p.sum(0); break;
    case ReduceOp::AVG: reduced = p.sum(0).div_(size); break;
    case ReduceOp::MIN: reduced = std::get<0>(p.min(0)); break;
    case ReduceOp::MAX: reduced = std::get<0>(p.max(0)); break;
  }
  flat_out.copy_(reduced);
}

// into = a op b for SUM, AVG (a sum; the division is the caller's), MIN and MAX. Operand order
// matters for the bits of a sum's NaN payloads only, and each caller keeps its algorithm's.
void combine_into(ReduceOp op, at::Tensor into, const at::Tensor& a, const at::Tensor& b) {
  if (op == ReduceOp::MIN)
    at::minimum_out(into, a, b);
  else if (op == ReduceOp::MAX)
    at::maximum_out(into, a, b);
  else
    at::add_out(into, a, b);
}

// reduce_scatter in a ring: N-1 steps, each passing one chunk-sized partial sum to the next
// rank, so a rank sends (N-1)/N of the input (allreduce-then-slice would send twice that).
// Chunks travel in segments of at most 1 MiB, like Gloo's own ring, so adding one segment
// overlaps receiving the next, and a finished segment is forwarded at once.
void ring_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const int n = g.size(), r = g.rank;
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  at::Tensor chunks = input.reshape({n, -1});
  at::Tensor out = output.reshape({-1});
  const int64_t chunk_numel = out.numel();
  const int64_t segment = std::max<int64_t>(1, (int64_t{1} << 20) / input.element_size());
  const int64_t segments = (chunk_numel + segment - 1) / segment;
  auto seg = [&](const at::Tensor& t, int64_t i) {
    return t.narrow(0, i * segment, std::min(segment, chunk_numel - i * segment));
  };
  auto post_send = [&](const at::Tensor& t, int64_t i, int step, std::vector<c10::intrusive_ptr<c10d::Work>>& sends) {
    std::vector<at::Tensor> v{as_wire(seg(t, i))};
    sends.push_back(g.backend->send(v, next, static_cast<int>(step * segments + i)));
  };
  // Scratch: one chunk to receive into, two to build partial sums in (one may still be in flight),
  // kept by the group between calls: fresh pages cost more than the arithmetic.
  at::Tensor scratch = g.scratch(3 * chunk_numel * input.element_size()).view(input.scalar_type()).view({3, chunk_numel});
  at::Tensor recv = scratch[0];
  at::Tensor partial[2] = {scratch[1], scratch[2]};
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_in_flight[2];
  for (int64_t i = 0; i < segments; ++i) post_send(chunks[prev], i, 0, sends_in_flight[0]);
  for (int step = 0; step < n - 1; ++step) {
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs;
    for (int64_t i = 0; i < segments; ++i) {
      std::vector<at::Tensor> v{as_wire(seg(recv, i))};
      recvs.push_back(g.backend->recv(v, prev, static_cast<int>(step * segments + i)));
    }
    const bool last = step == n - 2;
    const at::Tensor own = chunks[((r - step - 2) % n + n) % n];  // the chunk whose partial arrives now
    at::Tensor& target = last ? out : partial[step % 2];
    auto& sends = sends_in_flight[(step + 1) % 2];
    wait_all(g, sends);  // `target` was last sent two steps ago
    sends.clear();
    for (int64_t i = 0; i < segments; ++i) {
      recvs[i]->wait(g.timeout);
      combine_into(op, seg(target, i), seg(recv, i), seg(own, i));
      if (!last) post_send(target, i, step + 1, sends);
    }
  }
  wait_all(g, sends_in_flight[0]);
  wait_all(g, sends_in_flight[1]);
  if (op == ReduceOp::AVG) out.div_(n);
}

// For half precision: one all-to-all (rank j receives every rank's chunk j) and a float32
// reduction, so the result is rounded once rather than at every hop of a ring.
void all_to_all_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                               ReduceOp op) {
  const int n = g.size();
  at::Tensor received = at::empty({input.numel()}, input.options());
  at::Tensor recv_wire = as_wire(received), send_wire = as_wire(input);
  std::vector<int64_t> equal;
  g.backend->alltoall_base(recv_wire, send_wire, equal, equal)->wait(g.timeout);
  reduce_chunks(received.view({n, -1}), output, op, n);
}

// Shared memory carries the bytes; the arithmetic is the Gloo paths', so that results do not
// depend on the transport: the ring's order of sums (rank j's chunk is ((x[j+1] + x[j+2]) +
// ...) + x[j], each x the chunk of the rank named), or for half precision the float32
// reduction of all ranks' chunks at once. AVG's division is the caller's, except in half.
ShmTransport::Combine shm_combine(const ProcessGroupImpl& g, ReduceOp op, bool half) {
  const int n = g.size(), r = g.rank;
  return [n, r, op, half, staging = at::Tensor()](const std::vector<at::Tensor>& pieces,
                                                  const at::Tensor& into) mutable {
    at::Tensor target = into;  // the *_out functions take a non-const handle
    if (half) {
      if (!staging.defined() || staging.size(1) < target.numel()) staging = at::empty({n, target.numel()}, target.options());
      at::Tensor parts = staging.narrow(1, 0, target.numel());
      for (int q = 0; q < n; ++q) parts[q].copy_(pieces[q]);
      return reduce_chunks(parts, target, op, n);
    }
    for (int step = 1; step < n; ++step) {
      const at::Tensor& partial = step == 1 ? pieces[(r + 1) % n] : target;
      const at::Tensor& own = pieces[(r + step + 1) % n];
      combine_into(op, target, partial, own);
    }
  };
}

// all_reduce over shared memory sums as the Gloo path does: a dtype Gloo reduces in Gloo's ring
// order (comm/gloo_ring_order.h), each addition rounded to the dtype; bfloat16, which Gloo
// cannot reduce, in float32 at once (run_all_reduce_by_scatter_gather). AVG's division is the
// caller's, except in bfloat16.
ShmTransport::PlacedCombine shm_all_reduce_combine(const ProcessGroupImpl& g, ReduceOp op,
                                                           const at::Tensor& tensor) {
  const int n = g.size();
  if (tensor.scalar_type() == at::kBFloat16)  // the one dtype Gloo cannot reduce
    return [all_at_once = shm_combine(g, op, /*half=*/true)](int64_t, const std::vector<at::Tensor>& pieces,
                                                             const at::Tensor& target) {
      all_at_once(pieces, target);
    };
  const int64_t chunk = gloo_ring_chunk_numel(tensor.numel(), tensor.element_size(), n);
  return [n, op, chunk](int64_t first, const std::vector<at::Tensor>& pieces, const at::Tensor& into) {
    // The range may span the end of one of Gloo's chunks; each part sums in its chunk's order.
    for (int64_t done = 0; done < into.numel();) {
      const int64_t c = (first + done) / chunk;
      const int64_t len = std::min((c + 1) * chunk - (first + done), into.numel() - done);
      at::Tensor target = into.narrow(0, done, len);
      auto piece = [&](int k) { return pieces[gloo_ring_summand(c, k, n)].narrow(0, done, len); };
      // Gloo adds its own values to the partial sum it received: own + partial.
      for (int k = 1; k < n; ++k) {
        const at::Tensor own = piece(k), partial = k == 1 ? piece(0) : target;
        combine_into(op, target, own, partial);
      }
      done += len;
    }
  };
}

// For dtypes Gloo cannot reduce (bfloat16): reduce_scatter then all_gather on a padded copy.
void run_all_reduce_by_scatter_gather(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op) {
  const int n = g.size();
  const int64_t numel = tensor.numel(), chunk = (numel + n - 1) / n;
  at::Tensor padded = at::zeros({chunk * n}, tensor.options());
  at::Tensor flat = tensor.reshape({-1});
  padded.narrow(0, 0, numel).copy_(flat);
  at::Tensor shard = at::empty({chunk}, tensor.options());
  run_reduce_scatter(g, shard, padded, op);
  run_all_gather(g, padded, shard);
  flat.copy_(padded.narrow(0, 0, numel));
}


}  // namespace

// all_gather as N-1 concurrent point-to-point exchanges straight into output's chunks:
// no staging copy, and each rank sends its input once to each peer, (N-1)/N of output.
void run_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input) {
  if (g.fake) return run_fake_exchange(input);
  if (takes_device_path(g, input)) return run_device_all_gather(g, output, input);
  if (auto* shm = shm_transport(g)) return shm->all_gather(output, input);
  const int n = g.size(), r = g.rank;
  at::Tensor chunks = as_wire(output).view({n, -1});
  at::Tensor in = as_wire(input);
  chunks[r].copy_(in);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int step = 1; step < n; ++step) {
    std::vector<at::Tensor> send{in};
    std::vector<at::Tensor> recv{chunks[(r - step + n) % n]};
    works.push_back(g.backend->send(send, (r + step) % n, 0));
    works.push_back(g.backend->recv(recv, (r - step + n) % n, 0));
  }
  wait_all(g, works);
}

// all_gather with each rank's block where `layout` puts it. Over shared memory the peers'
// bytes are copied from the segment straight to their places; over Gloo a peer's block
// arrives whole (one message, as above) and is placed from a rank-major copy, here on the
// comm thread.
void run_all_gather_into_layout(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                                const GatherLayout& layout) {
  if (g.fake) return run_fake_exchange(input);
  if (takes_device_path(g, input)) return run_device_all_gather_into_layout(g, output, input, layout);
  void* out = output.data_ptr();
  const size_t element = input.element_size();
  const int64_t block = input.numel();
  if (g.size() == 1) return layout.place(out, 0, 0, block, input.data_ptr(), element);
  if (auto* shm = shm_transport(g))
    return shm->all_gather(output, input, [&](int q, int64_t offset, const uint8_t* bytes, int64_t len) {
      layout.place(out, q, offset / static_cast<int64_t>(element), len / static_cast<int64_t>(element), bytes, element);
    });
  const at::Tensor gathered = at::empty({output.numel()}, input.options());
  run_all_gather(g, gathered, input);
  layout.place_rank_major(out, gathered.data_ptr(), element);
}

void run_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  if (g.fake) return run_fake_exchange(input);
  if (takes_device_path(g, input)) return run_device_reduce_scatter(g, output, input, op);
  if (g.size() == 1) {
    output.reshape({-1}).copy_(input.reshape({-1}));
    return;
  }
  const bool half = is_half(input.scalar_type());
  if (auto* shm = shm_transport(g)) {
    // The ring's order writes this rank's chunk before it reads it last: an output inside
    // the input (in place) gets its sums elsewhere first.
    const auto* in = static_cast<const char*>(input.data_ptr());
    const auto* out = static_cast<const char*>(output.data_ptr());
    const bool overlaps = out < in + input.nbytes() && in < out + output.nbytes();
    at::Tensor target = overlaps ? at::empty_like(output) : output;
    shm->reduce_scatter(target, input, shm_combine(g, op, half));
    if (op == ReduceOp::AVG && !half) target.div_(g.size());
    if (overlaps) output.copy_(target);
    return;
  }
  if (half) return all_to_all_reduce_scatter(g, output, input, op);
  ring_reduce_scatter(g, output, input, op);
}

void run_all_reduce(const ProcessGroupImpl& g, const at::Tensor& tensor, ReduceOp op) {
  if (g.fake) return run_fake_exchange(tensor);
  if (takes_device_path(g, tensor)) return run_device_all_reduce(g, tensor, op);
  if (g.size() == 1) return;
  const bool native = gloo_can_reduce(tensor.scalar_type());
  if (auto* shm = shm_transport(g)) {
    shm->all_reduce(tensor, shm_all_reduce_combine(g, op, tensor));
    if (op == ReduceOp::AVG && native) tensor.div_(g.size());
    return;
  }
  if (!native) return run_all_reduce_by_scatter_gather(g, tensor, op);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  options.timeout = g.timeout;
  g.backend->allreduce(tensors, options)->wait(g.timeout);
  if (op == ReduceOp::AVG) tensor.div_(g.size());
}

void run_broadcast(const ProcessGroupImpl& g, const at::Tensor& tensor, int root_group_rank) {
  if (g.fake) return run_fake_exchange(tensor);
  if (takes_device_path(g, tensor)) return run_device_broadcast(g, tensor, root_group_rank);
  if (g.size() == 1) return;
  std::vector<at::Tensor> tensors{as_wire(tensor)};
  c10d::BroadcastOptions options;
  options.rootRank = root_group_rank;
  options.timeout = g.timeout;
  g.backend->broadcast(tensors, options)->wait(g.timeout);
}

void run_all_to_all(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input,
                    std::vector<int64_t> output_elements, std::vector<int64_t> input_elements) {
  if (g.fake) return run_fake_exchange(input);
  if (takes_device_path(g, input)) return run_device_all_to_all(g, output, input, output_elements, input_elements);
  at::Tensor out = as_wire(output), in = as_wire(input);
  g.backend->alltoall_base(out, in, output_elements, input_elements)->wait(g.timeout);
}

void run_barrier(const ProcessGroupImpl& g) {
  if (g.fake) return run_fake_exchange(at::Tensor());
  c10d::BarrierOptions options;
  options.timeout = g.timeout;
  g.backend->barrier(options)->wait(g.timeout);
}

void run_broadcast_bytes(const ProcessGroupImpl& g, std::string& bytes, int root_group_rank) {
  if (g.fake) return run_fake_exchange(at::Tensor());
  if (g.size() == 1) return;
  at::Tensor length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  std::vector<at::Tensor> header{length};
  c10d::BroadcastOptions options;
  options.rootRank = root_group_rank;
  options.timeout = g.timeout;
  g.backend->broadcast(header, options)->wait(g.timeout);
  bytes.resize(static_cast<size_t>(length.item<int64_t>()));
  if (bytes.empty()) return;
  std::vector<at::Tensor> body{at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte)};
  g.backend->broadcast(body, options)->wait(g.timeout);
}

}  // namespace fsdpp::detail

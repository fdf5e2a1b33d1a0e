#include <fsdpp/collectives.h>

#include <numeric>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>

#include "comm/chained_collectives.h"
#include "comm/error_message.h"
#include "comm/gloo_ring_order.h"
#include "comm/hang_report.h"
#include "comm/process_group_impl.h"
#include "comm/shm_transport.h"
#include "comm/wire_bytes.h"
#include "profiler/timeline.h"

namespace fsdpp {
namespace {

using detail::ProcessGroupImpl;

// What a rank is about to do, compared across ranks before each collective
// (check_collectives) so that a mismatch is an error, not a hang or garbage.
struct Intent {
  enum Field { kKind, kSeq, kDtype, kInput, kOutput, kOp, kRoot, kExtra, kFields };
  std::vector<int64_t> fields = std::vector<int64_t>(kFields, -1);
  std::vector<int64_t> extra;  // all_to_all_single: this rank's input then output split sizes
};

const char* const kKindNames[] = {"all_reduce",     "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "all_to_all_single", "barrier", "broadcast_bytes"};
enum Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier, kBroadcastBytes };

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type();
  return out.str();
}

std::string describe(const std::vector<int64_t>& f) {
  std::ostringstream out;
  int64_t kind = f[Intent::kKind];
  out << (kind >= 0 && kind <= kBroadcastBytes ? kKindNames[kind] : "?") << " #" << f[Intent::kSeq];
  if (f[Intent::kDtype] >= 0) out << " " << c10::toString(static_cast<at::ScalarType>(f[Intent::kDtype]));
  if (f[Intent::kInput] >= 0) out << " input " << f[Intent::kInput] << " elements";
  if (f[Intent::kOutput] >= 0) out << " output " << f[Intent::kOutput] << " elements";
  if (f[Intent::kOp] >= 0) out << " op " << to_string(static_cast<ReduceOp>(f[Intent::kOp]));
  if (f[Intent::kRoot] >= 0) out << " src rank " << f[Intent::kRoot];
  return out.str();
}

std::vector<at::Tensor> exchange(const ProcessGroupImpl& g, const std::vector<int64_t>& values) {
  at::Tensor mine = at::tensor(values, at::kLong);
  std::vector<at::Tensor> inputs{mine};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < g.size(); ++i) outputs[0].push_back(at::empty_like(mine));
  g.backend->allgather(outputs, inputs)->wait(g.timeout);
  return outputs[0];
}

void check_intent(const ProcessGroupImpl& g, const Intent& intent) {
  auto all = exchange(g, intent.fields);
  std::ostringstream mismatch;
  for (int r = 0; r < g.size(); ++r) {
    if (!all[r].equal(all[g.rank])) {
      mismatch << "ranks of " << g.name << " disagree on a collective: ";
      for (int q = 0; q < g.size(); ++q) {
        auto f = all[q];
        std::vector<int64_t> v(f.data_ptr<int64_t>(), f.data_ptr<int64_t>() + f.numel());
        mismatch << (q ? "; " : "") << "rank " << g.ranks[q] << ": " << describe(v);
      }
      throw Error(mismatch.str());
    }
  }
  if (intent.extra.empty()) return;
  // all_to_all_single: what rank i sends to j must be what j expects from i.
  auto splits = exchange(g, intent.extra);
  const int n = g.size();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int64_t sends = splits[i].data_ptr<int64_t>()[j];
      int64_t expects = splits[j].data_ptr<int64_t>()[n + i];
      if (sends != expects)
        throw Error("all_to_all_single: rank " + std::to_string(g.ranks[i]) + " sends " + std::to_string(sends) +
                    " elements to rank " + std::to_string(g.ranks[j]) + ", which expects " + std::to_string(expects));
    }
}

// A view of the same bytes as a dtype Gloo accepts (it rejects bfloat16 and int16), for
// collectives that only move bytes: no arithmetic happens on them.
at::Tensor as_wire(const at::Tensor& t) {
  at::Tensor flat = t.reshape({-1});
  switch (t.element_size()) {
    case 1: return flat.view(at::kByte);
    case 2: return flat.view(at::kHalf);
    case 4: return flat.view(at::kInt);
    default: return flat.view(at::kLong);
  }
}

bool gloo_can_reduce(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kChar: case at::kByte: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

void require_tensor(const at::Tensor& t, const char* collective, const char* role) {
  if (!t.defined()) throw Error(std::string(collective) + ": the " + role + " tensor is undefined");
  if (!t.is_contiguous()) throw Error(std::string(collective) + ": the " + role + " tensor " + shape_of(t) + " is not contiguous");
  if (t.is_sparse()) throw Error(std::string(collective) + ": the " + role + " tensor is sparse");
}

void require_op_for(ReduceOp op, at::ScalarType dtype, const char* collective) {
  if (op == ReduceOp::AVG && !at::isFloatingType(dtype))
    throw Error(std::string(collective) + ": AVG needs a floating-point tensor, got " + c10::toString(dtype));
  if (dtype == at::kBool || at::isComplexType(dtype))
    throw Error(std::string(collective) + ": cannot reduce a " + c10::toString(dtype) + " tensor");
}

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

// all_gather as N-1 concurrent point-to-point exchanges straight into output's chunks:
// no staging copy, and each rank sends its input once to each peer, (N-1)/N of output.
void run_all_gather(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input) {
  if (auto* shm = detail::shm_transport(g)) return shm->all_gather(output, input);
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
                                const detail::GatherLayout& layout) {
  void* out = output.data_ptr();
  const size_t element = input.element_size();
  const int64_t block = input.numel();
  if (g.size() == 1) return layout.place(out, 0, 0, block, input.data_ptr(), element);
  if (auto* shm = detail::shm_transport(g))
    return shm->all_gather(output, input, [&](int q, int64_t offset, const uint8_t* bytes, int64_t len) {
      layout.place(out, q, offset / static_cast<int64_t>(element), len / static_cast<int64_t>(element), bytes, element);
    });
  const at::Tensor gathered = at::empty({output.numel()}, input.options());
  run_all_gather(g, gathered, input);
  layout.place_rank_major(out, gathered.data_ptr(), element);
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
detail::ShmTransport::Combine shm_combine(const ProcessGroupImpl& g, ReduceOp op, bool half) {
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
detail::ShmTransport::PlacedCombine shm_all_reduce_combine(const ProcessGroupImpl& g, ReduceOp op,
                                                           const at::Tensor& tensor) {
  const int n = g.size();
  if (tensor.scalar_type() == at::kBFloat16)  // the one dtype Gloo cannot reduce
    return [all_at_once = shm_combine(g, op, /*half=*/true)](int64_t, const std::vector<at::Tensor>& pieces,
                                                             const at::Tensor& target) {
      all_at_once(pieces, target);
    };
  const int64_t chunk = detail::gloo_ring_chunk_numel(tensor.numel(), tensor.element_size(), n);
  return [n, op, chunk](int64_t first, const std::vector<at::Tensor>& pieces, const at::Tensor& into) {
    // The range may span the end of one of Gloo's chunks; each part sums in its chunk's order.
    for (int64_t done = 0; done < into.numel();) {
      const int64_t c = (first + done) / chunk;
      const int64_t len = std::min((c + 1) * chunk - (first + done), into.numel() - done);
      at::Tensor target = into.narrow(0, done, len);
      auto piece = [&](int k) { return pieces[detail::gloo_ring_summand(c, k, n)].narrow(0, done, len); };
      // Gloo adds its own values to the partial sum it received: own + partial.
      for (int k = 1; k < n; ++k) {
        const at::Tensor own = piece(k), partial = k == 1 ? piece(0) : target;
        combine_into(op, target, own, partial);
      }
      done += len;
    }
  };
}

void run_reduce_scatter(const ProcessGroupImpl& g, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  if (g.size() == 1) {
    output.reshape({-1}).copy_(input.reshape({-1}));
    return;
  }
  const bool half = is_half(input.scalar_type());
  if (auto* shm = detail::shm_transport(g)) {
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

// `src` is a global rank, as in PyTorch; Gloo wants the group rank.
int group_root(const ProcessGroup& group, int src) {
  return (group.defined() ? group : default_group()).group_rank(src);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    default: return c10d::ReduceOp::SUM;  // AVG divides afterwards
  }
}

// The profiler's view of a collective: issued on the caller's thread (inside its innermost
// record_function), then run on the group's comm thread.
struct TraceIssue {
  long long at_us = -1;  // -1: not recording when issued
  std::string in;
};

TraceIssue trace_issue(const std::string& name, const std::string& description) {
  TraceIssue issue{profiler::detail::now_us(), profiler::detail::current_span()};
  profiler::detail::record({"issue " + name, "collective", issue.at_us, -1, {{"collective", description}, {"in", issue.in}}});
  return issue;
}

// A span of the comm thread's track, from the start of the run to its end (or failure).
class TraceRun {
 public:
  TraceRun(const ProcessGroupImpl& g, const std::string& name, const std::string& description, const TraceIssue& issue,
           int64_t bytes_sent)
      : name_(name), description_(description), issue_(issue), bytes_sent_(bytes_sent) {
    if (!profiler::detail::recording()) return;
    start_us_ = profiler::detail::now_us();
    profiler::detail::name_this_thread("comm thread of group " + g.name);
  }
  ~TraceRun() {
    if (start_us_ < 0) return;
    std::vector<std::pair<std::string, std::string>> args{{"collective", description_},
                                                          {"bytes sent", std::to_string(bytes_sent_)}};
    if (issue_.at_us >= 0) {
      args.emplace_back("issued in", issue_.in);
      args.emplace_back("queued us", std::to_string(start_us_ - issue_.at_us));
    }
    if (std::uncaught_exceptions() > 0) args.emplace_back("failed", "yes");
    profiler::detail::record({name_, "collective", start_us_, profiler::detail::now_us() - start_us_, std::move(args)});
  }
  TraceRun(const TraceRun&) = delete;
  TraceRun& operator=(const TraceRun&) = delete;

 private:
  const std::string& name_;
  const std::string& description_;
  const TraceIssue& issue_;
  int64_t bytes_sent_;
  long long start_us_ = -1;
};

// Validation and counting happen in the caller's thread; the exchange itself runs on the
// group's comm thread, preceded by the cross-rank check when it is on. A chained collective
// (`after` given) first waits there for `after`, outside its span of the timeline.
Work submit(const ProcessGroupImpl& g, Kind kind, Intent intent, int64_t bytes_sent, const std::string& what,
            bool async_op, std::function<void()> run, Work after = Work()) {
  const int64_t seq = g.next_seq++;
  intent.fields[Intent::kKind] = kind;
  intent.fields[Intent::kSeq] = seq;
  if (bytes_sent >= 0) CommDebugMode::record(kKindNames[kind], bytes_sent);
  std::string description = std::string(kKindNames[kind]) + "(" + what + ") #" + std::to_string(seq) + " on " + g.where();
  const bool check = g.check_collectives && g.size() > 1;
  std::string trace_name = std::string(kKindNames[kind]) + " #" + std::to_string(seq) + " " + g.name;
  auto issued = profiler::detail::recording() ? trace_issue(trace_name, description) : TraceIssue{};
  auto state = g.comm_thread->enqueue(description, [&g, check, seq, description, intent = std::move(intent),
                                                    run = std::move(run), trace_name, issued, bytes_sent,
                                                    after = std::move(after)] {
    try {
      after.wait();
    } catch (const std::exception& e) {
      throw Error(description + " not run: " + detail::message_without_backtrace(e));
    }
    TraceRun traced(g, trace_name, description, issued, bytes_sent);
    try {
      if (check) check_intent(g, intent);
      run();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const bool own_timeout = detail::is_timeout(e);
      if (g.failed.exchange(true)) {  // an earlier collective of this group already failed here
        if (!own_timeout) throw;
        throw Error(description + " failed: timed out after an earlier collective of " + g.where() + " failed");
      }
      if (!own_timeout && !detail::peer_timed_out(g, seq)) throw;
      // Say who is missing, not just that the wait ended (and without c10's backtrace).
      throw Error(description + " failed: " + detail::report_hang(g, seq, description, own_timeout));
    }
  });
  state->trace_name = std::move(trace_name);
  Work work(state);
  if (!async_op) work.wait();
  return work;
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
  }
  return "?";
}

namespace {

Work all_reduce_impl(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool async_op, Work after,
                     std::function<void()> prepare) {
  const auto& g = detail::member_group(group, "all_reduce");
  require_tensor(tensor, "all_reduce", "input");
  require_op_for(op, tensor.scalar_type(), "all_reduce");
  Intent intent;
  intent.fields[Intent::kDtype] = static_cast<int64_t>(tensor.scalar_type());
  intent.fields[Intent::kInput] = tensor.numel();
  intent.fields[Intent::kOp] = static_cast<int64_t>(op);
  const int n = g.size();
  const int64_t bytes = tensor.numel() * tensor.element_size();
  const bool native = gloo_can_reduce(tensor.scalar_type());
  const int64_t chunk_bytes = (tensor.numel() + n - 1) / n * tensor.element_size();
  int64_t wire = native ? detail::ring_all_reduce_bytes(bytes, tensor.element_size(), g.rank, n)
                        : 2 * (n - 1) * chunk_bytes;
  if (n == 1) wire = 0;
  auto run = [&g, tensor, op, native, prepare = std::move(prepare)] {
    if (prepare) prepare();
    if (g.size() == 1) return;
    if (auto* shm = detail::shm_transport(g)) {
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
  };
  return submit(g, kAllReduce, intent, wire, shape_of(tensor) + ", " + to_string(op), async_op, std::move(run),
                std::move(after));
}

}  // namespace

Work all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool async_op) {
  return all_reduce_impl(tensor, op, group, async_op, Work(), {});
}

namespace detail {

Work all_reduce_after(const Work& after, const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group,
                      std::function<void()> prepare) {
  return all_reduce_impl(tensor, op, group, /*async_op=*/true, after, std::move(prepare));
}

}  // namespace detail

Work broadcast(const at::Tensor& tensor, int src, const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "broadcast");
  require_tensor(tensor, "broadcast", "input");
  const int root = group_root(group, src);
  Intent intent;
  intent.fields[Intent::kDtype] = static_cast<int64_t>(tensor.scalar_type());
  intent.fields[Intent::kInput] = tensor.numel();
  intent.fields[Intent::kRoot] = src;
  const int64_t bytes = detail::tree_broadcast_sends(g.rank, root, g.size()) * tensor.numel() * tensor.element_size();
  return submit(g, kBroadcast, intent, bytes, shape_of(tensor) + ", src " + std::to_string(src), async_op,
                [&g, tensor, root] {
                  if (g.size() == 1) return;
                  std::vector<at::Tensor> tensors{as_wire(tensor)};
                  c10d::BroadcastOptions options;
                  options.rootRank = root;
                  options.timeout = g.timeout;
                  g.backend->broadcast(tensors, options)->wait(g.timeout);
                });
}

namespace {

Work all_gather_into_tensor_impl(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                                 bool async_op, std::function<void()> prepare = {},
                                 std::shared_ptr<const detail::GatherLayout> layout = nullptr) {
  const char* name = "all_gather_into_tensor";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  if (output.scalar_type() != input.scalar_type())
    throw Error(std::string(name) + ": output " + shape_of(output) + " and input " + shape_of(input) + " differ in dtype");
  if (output.numel() != input.numel() * g.size())
    throw Error(std::string(name) + ": output " + shape_of(output) + " must hold " + std::to_string(g.size()) +
                " x input " + shape_of(input) + " (" + std::to_string(input.numel() * g.size()) + " elements) on " +
                g.where());
  Intent intent;
  intent.fields[Intent::kDtype] = static_cast<int64_t>(input.scalar_type());
  intent.fields[Intent::kInput] = input.numel();
  intent.fields[Intent::kOutput] = output.numel();
  const int64_t bytes = (g.size() - 1) * input.numel() * input.element_size();
  return submit(g, kAllGather, intent, bytes, "output " + shape_of(output) + ", input " + shape_of(input), async_op,
                [&g, output, input, prepare = std::move(prepare), layout = std::move(layout)] {
                  if (prepare) prepare();
                  if (layout)
                    run_all_gather_into_layout(g, output, input, *layout);
                  else
                    run_all_gather(g, output, input);
                });
}

}  // namespace

Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                            bool async_op) {
  return all_gather_into_tensor_impl(output, input, group, async_op);
}

namespace detail {

Work all_gather_into_tensor_prepared(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                                     std::function<void()> prepare) {
  return all_gather_into_tensor_impl(output, input, group, /*async_op=*/true, std::move(prepare));
}

Work all_gather_into_layout(const at::Tensor& output, const at::Tensor& input,
                            std::shared_ptr<const GatherLayout> layout, const ProcessGroup& group,
                            std::function<void()> prepare) {
  if (!layout) throw Error("all_gather_into_layout: no layout (all_gather_into_tensor_prepared gathers rank-major)");
  return all_gather_into_tensor_impl(output, input, group, /*async_op=*/true, std::move(prepare), std::move(layout));
}

}  // namespace detail

namespace {

Work reduce_scatter_tensor_impl(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                const ProcessGroup& group, bool async_op, std::function<void()> done) {
  const char* name = "reduce_scatter_tensor";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  require_op_for(op, input.scalar_type(), name);
  if (output.scalar_type() != input.scalar_type())
    throw Error(std::string(name) + ": output " + shape_of(output) + " and input " + shape_of(input) + " differ in dtype");
  if (input.numel() != output.numel() * g.size())
    throw Error(std::string(name) + ": input " + shape_of(input) + " must hold " + std::to_string(g.size()) +
                " x output " + shape_of(output) + " (" + std::to_string(output.numel() * g.size()) + " elements) on " +
                g.where());
  Intent intent;
  intent.fields[Intent::kDtype] = static_cast<int64_t>(input.scalar_type());
  intent.fields[Intent::kInput] = input.numel();
  intent.fields[Intent::kOutput] = output.numel();
  intent.fields[Intent::kOp] = static_cast<int64_t>(op);
  const int64_t bytes = (g.size() - 1) * output.numel() * output.element_size();
  return submit(g, kReduceScatter, intent, bytes,
                "output " + shape_of(output) + ", input " + shape_of(input) + ", " + to_string(op), async_op,
                [&g, output, input, op, done = std::move(done)] {
                  run_reduce_scatter(g, output, input, op);
                  if (done) done();
                });
}

}  // namespace

Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op, const ProcessGroup& group,
                           bool async_op) {
  return reduce_scatter_tensor_impl(output, input, op, group, async_op, {});
}

namespace detail {

Work reduce_scatter_tensor_then(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                const ProcessGroup& group, std::function<void()> done) {
  return reduce_scatter_tensor_impl(output, input, op, group, /*async_op=*/true, std::move(done));
}

}  // namespace detail

Work all_to_all_single(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes, const ProcessGroup& group, bool async_op) {
  const char* name = "all_to_all_single";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  if (output.scalar_type() != input.scalar_type())
    throw Error(std::string(name) + ": output " + shape_of(output) + " and input " + shape_of(input) + " differ in dtype");
  const int n = g.size();
  // Rows of dim 0 -> elements, validated against the tensors.
  auto to_elements = [&](const at::Tensor& t, std::vector<int64_t> splits, const char* role) {
    const int64_t rows = t.dim() ? t.size(0) : 1;
    const int64_t row_numel = rows ? t.numel() / rows : 0;
    if (splits.empty()) {
      if (rows % n) throw Error(std::string(name) + ": " + role + " " + shape_of(t) + " has " + std::to_string(rows) +
                                " rows, not divisible by the group size " + std::to_string(n));
      splits.assign(n, rows / n);
    }
    if (static_cast<int>(splits.size()) != n)
      throw Error(std::string(name) + ": " + role + " split sizes have " + std::to_string(splits.size()) +
                  " entries for a group of " + std::to_string(n));
    if (std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows)
      throw Error(std::string(name) + ": " + role + " split sizes do not add up to the " + std::to_string(rows) +
                  " rows of " + shape_of(t));
    for (auto& s : splits) s *= row_numel;
    return splits;
  };
  std::vector<int64_t> out_elems = to_elements(output, output_split_sizes, "output");
  std::vector<int64_t> in_elems = to_elements(input, input_split_sizes, "input");
  Intent intent;
  intent.fields[Intent::kDtype] = static_cast<int64_t>(input.scalar_type());
  intent.fields[Intent::kExtra] = 2 * n;
  intent.extra = in_elems;
  intent.extra.insert(intent.extra.end(), out_elems.begin(), out_elems.end());
  int64_t bytes = 0;
  for (int j = 0; j < n; ++j)
    if (j != g.rank) bytes += in_elems[j] * input.element_size();
  return submit(g, kAllToAll, intent, bytes, "output " + shape_of(output) + ", input " + shape_of(input), async_op,
                [&g, output, input, out_elems, in_elems] {
                  at::Tensor out = as_wire(output), in = as_wire(input);
                  auto out_counts = out_elems, in_counts = in_elems;
                  g.backend->alltoall_base(out, in, out_counts, in_counts)->wait(g.timeout);
                });
}

Work barrier(const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "barrier");
  return submit(g, kBarrier, Intent{}, 0, "", async_op, [&g] {
    c10d::BarrierOptions options;
    options.timeout = g.timeout;
    g.backend->barrier(options)->wait(g.timeout);
  });
}

Work broadcast_bytes(std::string& bytes, int src, const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "broadcast_bytes");
  const int root = group_root(group, src);
  Intent intent;
  intent.fields[Intent::kRoot] = src;
  // Only the root knows the size before the exchange, so this one is counted when it ends.
  return submit(g, kBroadcastBytes, intent, -1, "src " + std::to_string(src), async_op,
                [&g, &bytes, root] {
                  struct Count {
                    const ProcessGroupImpl& g; const std::string& bytes; int root;
                    ~Count() {
                      const int64_t sends = detail::tree_broadcast_sends(g.rank, root, g.size());
                      CommDebugMode::record(kKindNames[kBroadcastBytes], sends * (8 + static_cast<int64_t>(bytes.size())));
                    }
                  } count{g, bytes, root};
                  if (g.size() == 1) return;
                  at::Tensor length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
                  std::vector<at::Tensor> header{length};
                  c10d::BroadcastOptions options;
                  options.rootRank = root;
                  options.timeout = g.timeout;
                  g.backend->broadcast(header, options)->wait(g.timeout);
                  bytes.resize(static_cast<size_t>(length.item<int64_t>()));
                  if (bytes.empty()) return;
                  std::vector<at::Tensor> body{at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte)};
                  g.backend->broadcast(body, options)->wait(g.timeout);
                });
}

}  // namespace fsdpp

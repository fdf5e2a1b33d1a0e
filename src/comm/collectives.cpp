// The public collectives of include/fsdpp/collectives.h and the chained ones of
// comm/chained_collectives.h: each validates its tensors (errors name the collective, the
// shapes and the group), says what it intends for the cross-rank check (comm/collective_intent.h)
// and what it will send for CommDebugMode (comm/wire_bytes.h), and submits its algorithm
// (comm/collective_algorithms.h) to the group's comm thread (comm/collective_submission.h).
#include <fsdpp/collectives.h>

#include <numeric>
#include <sstream>

#include <ATen/ATen.h>

#include <fsdpp/error.h>

#include "comm/chained_collectives.h"
#include "comm/collective_algorithms.h"
#include "comm/collective_intent.h"
#include "comm/collective_submission.h"
#include "comm/process_group_impl.h"
#include "comm/transport_dtypes.h"
#include "comm/wire_bytes.h"

namespace fsdpp {
namespace {

using detail::CollectiveIntent;
using detail::ProcessGroupImpl;
using detail::submit;

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes() << " " << t.scalar_type();
  return out.str();
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

void require_same_dtype(const at::Tensor& output, const at::Tensor& input, const char* collective) {
  if (output.scalar_type() != input.scalar_type())
    throw Error(std::string(collective) + ": output " + shape_of(output) + " and input " + shape_of(input) +
                " differ in dtype");
}

void require_same_device(const at::Tensor& output, const at::Tensor& input, const char* collective) {
  if (output.device() != input.device())
    throw Error(std::string(collective) + ": output " + shape_of(output) + " is on " + output.device().str() +
                " and input " + shape_of(input) + " on " + input.device().str());
}

// all_gather's output, reduce_scatter's input: the group's size times the other tensor.
void require_group_times(const ProcessGroupImpl& g, const at::Tensor& whole, const char* whole_role,
                         const at::Tensor& part, const char* part_role, const char* collective) {
  if (whole.numel() != part.numel() * g.size())
    throw Error(std::string(collective) + ": " + whole_role + " " + shape_of(whole) + " must hold " +
                std::to_string(g.size()) + " x " + part_role + " " + shape_of(part) + " (" +
                std::to_string(part.numel() * g.size()) + " elements) on " + g.where());
}

// What the cross-rank check compares; -1 for what a collective does not have.
CollectiveIntent intent_of(at::ScalarType dtype, int64_t input, int64_t output = -1, int64_t op = -1) {
  CollectiveIntent intent;
  intent.fields[CollectiveIntent::kDtype] = static_cast<int64_t>(dtype);
  intent.fields[CollectiveIntent::kInput] = input;
  intent.fields[CollectiveIntent::kOutput] = output;
  intent.fields[CollectiveIntent::kOp] = op;
  return intent;
}

// `src` is a global rank, as in PyTorch; Gloo wants the group rank.
int group_root(const ProcessGroup& group, int src) {
  return (group.defined() ? group : default_group()).group_rank(src);
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
                     std::function<void()> prepare, bool counted = true, detail::CommStream* stream = nullptr) {
  const auto& g = detail::member_group(group, "all_reduce");
  require_tensor(tensor, "all_reduce", "input");
  require_op_for(op, tensor.scalar_type(), "all_reduce");
  CollectiveIntent intent = intent_of(tensor.scalar_type(), tensor.numel(), -1, static_cast<int64_t>(op));
  const auto sent = counted ? detail::SentBytes::at_issue(detail::all_reduce_wire_bytes(
                                  tensor.numel(), tensor.element_size(), detail::gloo_can_reduce(tensor.scalar_type()),
                                  g.rank, g.size()))
                            : detail::SentBytes::uncounted();
  auto run = [&g, tensor, op, prepare = std::move(prepare)] {
    if (prepare) prepare();
    detail::run_all_reduce(g, tensor, op);
  };
  return submit(g, detail::kAllReduce, intent, sent, shape_of(tensor) + ", " + to_string(op), async_op, std::move(run),
                std::move(after), detail::DeviceHandoff::at_issue(g, detail::kAllReduce, {tensor}, stream));
}

}  // namespace

Work all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool async_op) {
  return all_reduce_impl(tensor, op, group, async_op, Work(), {});
}

namespace detail {

Work all_reduce_after(const Work& after, const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group,
                      std::function<void()> prepare, CommStream* stream) {
  return all_reduce_impl(tensor, op, group, /*async_op=*/true, after, std::move(prepare), /*counted=*/true, stream);
}

void metadata_all_reduce(const at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  all_reduce_impl(tensor, op, group, /*async_op=*/false, Work(), {}, /*counted=*/false);
}

}  // namespace detail

Work broadcast(const at::Tensor& tensor, int src, const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "broadcast");
  require_tensor(tensor, "broadcast", "input");
  const int root = group_root(group, src);
  CollectiveIntent intent = intent_of(tensor.scalar_type(), tensor.numel());
  intent.fields[CollectiveIntent::kRoot] = src;
  const auto sent = detail::SentBytes::at_issue(
      detail::broadcast_wire_bytes(tensor.numel() * tensor.element_size(), g.rank, root, g.size()));
  return submit(g, detail::kBroadcast, intent, sent, shape_of(tensor) + ", src " + std::to_string(src), async_op,
                [&g, tensor, root] { detail::run_broadcast(g, tensor, root); }, Work(),
                detail::DeviceHandoff::at_issue(g, detail::kBroadcast, {tensor}));
}

namespace {

Work all_gather_into_tensor_impl(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                                 bool async_op, std::function<void()> prepare = {},
                                 std::shared_ptr<const detail::GatherLayout> layout = nullptr,
                                 detail::CommStream* stream = nullptr) {
  const char* name = "all_gather_into_tensor";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  require_same_dtype(output, input, name);
  require_same_device(output, input, name);
  require_group_times(g, output, "output", input, "input", name);
  CollectiveIntent intent = intent_of(input.scalar_type(), input.numel(), output.numel());
  const auto sent =
      detail::SentBytes::at_issue(detail::all_gather_wire_bytes(input.numel() * input.element_size(), g.size()));
  return submit(g, detail::kAllGather, intent, sent, "output " + shape_of(output) + ", input " + shape_of(input), async_op,
                [&g, output, input, prepare = std::move(prepare), layout = std::move(layout)] {
                  if (prepare) prepare();
                  if (layout)
                    detail::run_all_gather_into_layout(g, output, input, *layout);
                  else
                    detail::run_all_gather(g, output, input);
                }, Work(), detail::DeviceHandoff::at_issue(g, detail::kAllGather, {input, output}, stream));
}

}  // namespace

Work all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                            bool async_op) {
  return all_gather_into_tensor_impl(output, input, group, async_op);
}

namespace detail {

Work all_gather_into_tensor_prepared(const at::Tensor& output, const at::Tensor& input, const ProcessGroup& group,
                                     std::function<void()> prepare, CommStream* stream) {
  return all_gather_into_tensor_impl(output, input, group, /*async_op=*/true, std::move(prepare), nullptr, stream);
}

Work all_gather_into_layout(const at::Tensor& output, const at::Tensor& input,
                            std::shared_ptr<const GatherLayout> layout, const ProcessGroup& group,
                            std::function<void()> prepare, CommStream* stream) {
  if (!layout) throw Error("all_gather_into_layout: no layout (all_gather_into_tensor_prepared gathers rank-major)");
  return all_gather_into_tensor_impl(output, input, group, /*async_op=*/true, std::move(prepare), std::move(layout),
                                     stream);
}

}  // namespace detail

namespace {

Work reduce_scatter_tensor_impl(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                const ProcessGroup& group, bool async_op, std::function<void()> done,
                                detail::CommStream* stream = nullptr) {
  const char* name = "reduce_scatter_tensor";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  require_op_for(op, input.scalar_type(), name);
  require_same_dtype(output, input, name);
  require_same_device(output, input, name);
  require_group_times(g, input, "input", output, "output", name);
  CollectiveIntent intent = intent_of(input.scalar_type(), input.numel(), output.numel(), static_cast<int64_t>(op));
  const auto sent =
      detail::SentBytes::at_issue(detail::reduce_scatter_wire_bytes(output.numel() * output.element_size(), g.size()));
  return submit(g, detail::kReduceScatter, intent, sent,
                "output " + shape_of(output) + ", input " + shape_of(input) + ", " + to_string(op), async_op,
                [&g, output, input, op, done = std::move(done)] {
                  detail::run_reduce_scatter(g, output, input, op);
                  if (done) done();
                }, Work(), detail::DeviceHandoff::at_issue(g, detail::kReduceScatter, {input, output}, stream));
}

}  // namespace

Work reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input, ReduceOp op, const ProcessGroup& group,
                           bool async_op) {
  return reduce_scatter_tensor_impl(output, input, op, group, async_op, {});
}

namespace detail {

Work reduce_scatter_tensor_then(const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                const ProcessGroup& group, std::function<void()> done, CommStream* stream) {
  return reduce_scatter_tensor_impl(output, input, op, group, /*async_op=*/true, std::move(done), stream);
}

}  // namespace detail

Work all_to_all_single(const at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_split_sizes,
                       const std::vector<int64_t>& input_split_sizes, const ProcessGroup& group, bool async_op) {
  const char* name = "all_to_all_single";
  const auto& g = detail::member_group(group, name);
  require_tensor(output, name, "output");
  require_tensor(input, name, "input");
  require_same_dtype(output, input, name);
  require_same_device(output, input, name);
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
  CollectiveIntent intent;
  intent.fields[CollectiveIntent::kDtype] = static_cast<int64_t>(input.scalar_type());
  intent.fields[CollectiveIntent::kExtra] = 2 * n;
  intent.extra = in_elems;
  intent.extra.insert(intent.extra.end(), out_elems.begin(), out_elems.end());
  const auto sent = detail::SentBytes::at_issue(detail::all_to_all_wire_bytes(in_elems, input.element_size(), g.rank));
  return submit(g, detail::kAllToAll, intent, sent, "output " + shape_of(output) + ", input " + shape_of(input), async_op,
                [&g, output, input, out_elems, in_elems] {
                  detail::run_all_to_all(g, output, input, out_elems, in_elems);
                }, Work(), detail::DeviceHandoff::at_issue(g, detail::kAllToAll, {input, output}));
}

Work barrier(const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "barrier");
  return submit(g, detail::kBarrier, CollectiveIntent{}, detail::SentBytes::at_issue(detail::barrier_wire_bytes()), "", async_op,
                [&g] { detail::run_barrier(g); });
}

Work broadcast_bytes(std::string& bytes, int src, const ProcessGroup& group, bool async_op) {
  const auto& g = detail::member_group(group, "broadcast_bytes");
  const int root = group_root(group, src);
  CollectiveIntent intent;
  intent.fields[CollectiveIntent::kRoot] = src;
  // Only the root knows the size before the exchange, so this one is counted when it ends.
  auto sent = detail::SentBytes::at_end([&g, &bytes, root] {
    return detail::broadcast_string_wire_bytes(static_cast<int64_t>(bytes.size()), g.rank, root, g.size());
  });
  return submit(g, detail::kBroadcastBytes, intent, std::move(sent), "src " + std::to_string(src), async_op,
                [&g, &bytes, root] { detail::run_broadcast_bytes(g, bytes, root); });
}

}  // namespace fsdpp

#include <fsdpp/distributed_data_parallel.h>

#include <map>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "ddp/module_states.h"
#include "ddp/reducer.h"

namespace fsdpp {
namespace {

using detail::NamedTensors;
using detail::Reducer;
using detail::tensors_of;
using detail::unique_named;

std::string type_and_shape(const at::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << " " << t.sizes();
  return out.str();
}

// What every rank must agree on, one "key\tvalue" line each: the parameters and buffers in
// registration order, and the options that shape the buckets and the collectives.
std::string describe(const NamedTensors& params, const NamedTensors& buffers, const DistributedDataParallelOptions& o) {
  std::ostringstream out;
  for (const auto& p : params)
    out << "parameter '" << p.name << "'\t" << type_and_shape(p.tensor) << (p.tensor.requires_grad() ? "" : " (requires_grad false)")
        << (p.tensor.is_meta() ? " (meta device)" : "") << "\n";
  for (const auto& b : buffers)
    out << "buffer '" << b.name << "'\t" << type_and_shape(b.tensor) << (b.tensor.is_meta() ? " (meta device)" : "") << "\n";
  out << "options\tbucket_cap_mb " << o.bucket_cap_mb() << ", broadcast_buffers " << o.broadcast_buffers()
      << ", find_unused_parameters " << o.find_unused_parameters() << ", gradient_as_bucket_view "
      << o.gradient_as_bucket_view() << ", static_graph " << o.static_graph() << "\n";
  return out.str();
}

using Lines = std::vector<std::pair<std::string, std::string>>;

Lines parse(const std::string& description) {
  Lines lines;
  std::istringstream in(description);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    lines.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return lines;
}

// How rank `rb`'s description differs from rank `ra`'s, most telling first.
std::vector<std::string> differences(const std::string& a, const std::string& b, int ra, int rb) {
  const Lines la = parse(a), lb = parse(b);
  std::map<std::string, std::string> ma(la.begin(), la.end()), mb(lb.begin(), lb.end());
  const std::string on_a = " on rank " + std::to_string(ra), on_b = " on rank " + std::to_string(rb);
  std::vector<std::string> out;
  for (const auto& [key, value] : la) {
    auto it = mb.find(key);
    if (it == mb.end())
      out.push_back(key + " exists" + on_a + " but not" + on_b);
    else if (it->second != value)
      out.push_back(key + " is " + value + on_a + " but " + it->second + on_b);
  }
  for (const auto& [key, value] : lb)
    if (!ma.count(key)) out.push_back(key + " exists" + on_b + " but not" + on_a);
  if (out.empty()) {
    for (size_t i = 0; i < la.size() && i < lb.size(); ++i)
      if (la[i].first != lb[i].first) {
        out.push_back("parameters or buffers are registered in a different order" + on_a + " and" + on_b +
                      " (position " + std::to_string(i) + ": " + la[i].first + " vs " + lb[i].first + ")");
        break;
      }
  }
  return out;
}

// Every rank gets the same error naming what differs, or none does. Costs one broadcast of
// rank 0's description and one small all_reduce; the details travel only on a mismatch.
void verify_same_model(const std::string& mine, const ProcessGroup& group) {
  const int n = group.size();
  if (n == 1) return;
  const int root = group.global_rank(0);
  std::string reference = mine;
  broadcast_bytes(reference, root, group);
  at::Tensor differs = at::zeros({n}, at::kInt);
  differs[group.rank()] = static_cast<int>(reference != mine);
  all_reduce(differs, ReduceOp::MAX, group);
  if (differs.sum().item<int>() == 0) return;
  std::vector<std::string> problems;
  for (int q = 1; q < n; ++q) {
    if (differs[q].item<int>() == 0) continue;
    std::string theirs = group.rank() == q ? mine : std::string();
    broadcast_bytes(theirs, group.global_rank(q), group);
    for (auto& d : differences(reference, theirs, root, group.global_rank(q))) problems.push_back(std::move(d));
  }
  std::string message = "DistributedDataParallel: the model differs across the ranks of group " + group.name() + ": ";
  const size_t shown = std::min<size_t>(problems.size(), 10);
  for (size_t i = 0; i < shown; ++i) message += (i ? "; " : "") + problems[i];
  if (shown < problems.size()) message += "; and " + std::to_string(problems.size() - shown) + " more";
  throw Error(message);
}

}  // namespace

using DDP = DistributedDataParallel<torch::nn::Module>;

DDP::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module, DistributedDataParallelOptions options)
    : module_(std::move(module)) {
  if (!module_) throw Error("DistributedDataParallel: the module is null");
  ProcessGroup group = options.process_group().defined() ? options.process_group() : default_group();
  if (!group.is_member())
    throw Error("DistributedDataParallel: this process is not a member of group " + group.name());
  if (!(options.bucket_cap_mb() > 0))
    throw Error("DistributedDataParallel: bucket_cap_mb must be positive, got " + std::to_string(options.bucket_cap_mb()));
  options.process_group(group);

  NamedTensors params = unique_named(module_->named_parameters(/*recurse=*/true));
  NamedTensors buffers = unique_named(module_->named_buffers(/*recurse=*/true));
  // Meta tensors are part of the description, so ranks that differ in them fail the collective
  // check together; past it, every rank has the same ones.
  verify_same_model(describe(params, buffers, options), group);
  for (const NamedTensors* tensors : {&params, &buffers})
    for (const auto& t : *tensors)
      if (t.tensor.is_meta())
        throw Error("DistributedDataParallel: '" + t.name + "' is on the meta device (built under deferred_init); " +
                    "DDP replicates a materialized model: call fsdpp::materialize_module(model) first");

  std::vector<at::Tensor> state = tensors_of(params);
  for (const auto& b : buffers) state.push_back(b.tensor);
  detail::broadcast_coalesced(state, 0, group);

  NamedTensors trainable;
  for (auto& p : params)
    if (p.tensor.requires_grad()) trainable.push_back(p);
  if (trainable.empty())
    throw Error("DistributedDataParallel: the module has no parameter that requires a gradient, so there is nothing to synchronize");
  reducer_ = Reducer::create(std::move(trainable), group, std::move(options));
}

const DistributedDataParallelOptions& DDP::options() const { return reducer_->options(); }

const ProcessGroup& DDP::process_group() const { return reducer_->group(); }

DDP::NoSyncGuard::NoSyncGuard(std::shared_ptr<detail::Reducer> reducer) : reducer_(std::move(reducer)) {
  previous_ = reducer_->set_sync_enabled(false);
}

DDP::NoSyncGuard::NoSyncGuard(NoSyncGuard&& other) noexcept
    : reducer_(std::move(other.reducer_)), previous_(other.previous_) {
  other.reducer_.reset();
}

DDP::NoSyncGuard::~NoSyncGuard() {
  if (reducer_) reducer_->set_sync_enabled(previous_);
}

DDP::NoSyncGuard DDP::no_sync() { return NoSyncGuard(reducer_); }

void DDP::register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

void DDP::register_bucket_reduced_callback(BucketReducedCallback callback) {
  reducer_->register_bucket_reduced_callback(std::move(callback));
}

void DDP::sync_buffers() {
  detail::broadcast_coalesced(tensors_of(unique_named(module_->named_buffers(/*recurse=*/true))), 0, process_group());
}

void DDP::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  if (!torch::GradMode::is_enabled()) return;
  reducer_->prepare_for_backward(outputs);
}

std::vector<std::vector<std::string>> DDP::bucket_parameter_names() const { return reducer_->bucket_parameter_names(); }

size_t DDP::num_buckets() const { return reducer_->num_buckets(); }

void DDP::pre_forward() {
  if (reducer_->join_joinable()) return pre_forward_in_join();
  if (options().broadcast_buffers()) sync_buffers();
}

}  // namespace fsdpp

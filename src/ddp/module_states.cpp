#include "ddp/module_states.h"

#include <map>
#include <unordered_set>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <fsdpp/collectives.h>

namespace fsdpp::detail {

NamedTensors unique_named(const torch::OrderedDict<std::string, at::Tensor>& dict) {
  NamedTensors out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : dict)
    if (item.value().defined() && seen.insert(item.value().unsafeGetTensorImpl()).second)
      out.push_back({item.key(), item.value()});
  return out;
}

std::vector<at::Tensor> tensors_of(const NamedTensors& named) {
  std::vector<at::Tensor> out;
  for (const auto& n : named) out.push_back(n.tensor);
  return out;
}

void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root, const ProcessGroup& group) {
  if (group.size() == 1 || tensors.empty()) return;
  constexpr int64_t kChunkBytes = int64_t{256} << 20;
  const int root_global = group.global_rank(root);
  at::NoGradGuard no_grad;
  std::map<std::pair<int, std::string>, std::vector<at::Tensor>> by_type;
  std::vector<std::pair<int, std::string>> order;
  for (const auto& t : tensors) {
    auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    if (!by_type.count(key)) order.push_back(key);
    by_type[key].push_back(t);
  }
  auto flush = [&](std::vector<at::Tensor>& chunk) {
    if (chunk.empty()) return;
    std::vector<at::Tensor> flat;
    for (const auto& t : chunk) flat.push_back(t.detach().reshape({-1}));
    at::Tensor buffer = at::cat(flat);
    broadcast(buffer, root_global, group);
    int64_t offset = 0;
    for (const auto& t : chunk) {
      t.detach().copy_(buffer.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    chunk.clear();
  };
  for (const auto& key : order) {
    std::vector<at::Tensor> chunk;
    int64_t bytes = 0;
    for (const auto& t : by_type[key]) {
      const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
      if (!chunk.empty() && bytes + b > kChunkBytes) {
        flush(chunk);
        bytes = 0;
      }
      chunk.push_back(t);
      bytes += b;
    }
    flush(chunk);
  }
}

}  // namespace fsdpp::detail

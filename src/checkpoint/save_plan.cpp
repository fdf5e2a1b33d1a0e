// The save plan: staging this rank's state, and the plan every rank derives from all of them.
#include "checkpoint/save_plan.h"

#include "comm/error_message.h"

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/tiling.h"

namespace fsdpp::checkpoint::detail {

using nlohmann::json;

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

Staged stage(const State& state, bool clone) {
  Staged s;
  try {
    for (const auto& [key, e] : state) {
      if (key.empty()) throw Error("checkpoint::save: an entry has an empty key");
      auto add = [&, key = key](const at::Tensor& t, std::vector<int64_t> offsets, const std::vector<int64_t>& shape) {
        Item it;
        it.key = key;
        it.dtype = dtype_name(t.scalar_type());
        it.shape = shape;
        it.box = Box{std::move(offsets), t.sizes().vec()};
        // An empty shard holds no data, but it still tells the plan the tensor exists (a tensor
        // whose shards are all empty is a hole, or an empty tensor saved with no chunks).
        if (numel(it.box.sizes) == 0) {
          s.items.push_back(std::move(it));
          return;
        }
        // async_save stages a copy; save may write straight from the caller's memory.
        at::Tensor cpu = t.detach().to(at::kCPU);
        it.data = clone ? cpu.clone(at::MemoryFormat::Contiguous) : cpu.contiguous();
        s.items.push_back(std::move(it));
      };
      switch (e.kind()) {
        case Entry::Kind::kTensor:
          add(e.tensor(), std::vector<int64_t>(e.tensor().dim(), 0), e.global_shape());
          break;
        case Entry::Kind::kSharded:
          for (const auto& sh : e.shards()) add(sh.tensor, sh.offsets, e.global_shape());
          break;
        default:
          s.values.emplace(key, e);
      }
    }
  } catch (const std::exception& e) {
    s.error = fsdpp::detail::message_without_backtrace(e);  // an out-of-memory error from c10 carries one
  }
  return s;
}

std::string plan_of(const Staged& s) {
  json j;
  j["error"] = s.error;
  j["items"] = json::array();
  for (const auto& it : s.items)
    j["items"].push_back({{"key", it.key}, {"dtype", it.dtype}, {"shape", it.shape},
                          {"offsets", it.box.offsets}, {"sizes", it.box.sizes}});
  j["values"] = json::array();
  for (const auto& [key, e] : s.values) j["values"].push_back(key);
  return j.dump();
}

GlobalPlan make_plan(const std::vector<std::string>& plans) {
  const int n = static_cast<int>(plans.size());
  std::vector<json> js;
  for (const auto& p : plans) js.push_back(json::parse(p));
  std::string errors;
  for (int r = 0; r < n; ++r) {
    const std::string e = without_prefix(js[r]["error"].get<std::string>());
    if (!e.empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
  }
  if (!errors.empty()) throw Error("checkpoint::save: " + errors);

  GlobalPlan plan;
  std::map<std::string, int> tensor_rank, value_rank;  // first rank that has the key, per kind
  // key -> (offsets, sizes) -> ranks holding that box
  std::map<std::string, std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<int>>> boxes;
  for (int r = 0; r < n; ++r) {
    for (const auto& key : js[r]["values"]) value_rank.emplace(key.get<std::string>(), r);
    for (const auto& it : js[r]["items"]) {
      const auto key = it["key"].get<std::string>();
      const auto dtype = it["dtype"].get<std::string>();
      const auto shape = it["shape"].get<std::vector<int64_t>>();
      auto [pos, fresh] = plan.tensors.emplace(key, std::make_pair(dtype, shape));
      tensor_rank.emplace(key, r);
      if (!fresh && pos->second != std::make_pair(dtype, shape))
        throw Error("checkpoint::save: tensor '" + key + "' is " + pos->second.first + " " +
                    shape_string(pos->second.second) + " on rank " + std::to_string(tensor_rank[key]) + " but " +
                    dtype + " " + shape_string(shape) + " on rank " + std::to_string(r));
      const auto sizes = it["sizes"].get<std::vector<int64_t>>();
      if (numel(sizes) == 0) continue;  // nothing to write
      boxes[key][{it["offsets"].get<std::vector<int64_t>>(), sizes}].push_back(r);
    }
  }
  for (const auto& [key, r] : value_rank)
    if (tensor_rank.count(key))
      throw Error("checkpoint::save: '" + key + "' is a plain value on rank " + std::to_string(r) +
                  " but a tensor on rank " + std::to_string(tensor_rank[key]));

  // Each distinct box is written once (replicas deduplicated), by the holder with the fewest
  // bytes so far: replicated tensors spread over the ranks.
  std::vector<int64_t> load(n, 0);
  plan.writes.resize(n);
  for (const auto& [key, tensor] : plan.tensors) {
    const auto& [dtype, shape] = tensor;
    const auto& by_box = boxes[key];
    std::vector<std::pair<Box, std::vector<int>>> list;
    std::vector<Box> distinct;
    for (const auto& [b, ranks] : by_box) {
      list.push_back({Box{b.first, b.second}, ranks});
      distinct.push_back(list.back().first);
    }
    // The distinct shards must tile the global shape exactly (overflow-checked), as load and
    // verify will demand.
    const Box whole{std::vector<int64_t>(shape.size(), 0), shape};
    const TilingProblem problem = check_tiling(whole, distinct);
    int64_t total_bytes = 0;
    if (problem.kind != TilingProblem::Kind::kTooLarge && !checked_mul(problem.total, element_size(dtype), total_bytes))
      throw Error("checkpoint::save: tensor '" + key + "' of global shape " + shape_string(shape) + " and dtype " +
                  dtype + " has more bytes than a 64-bit count holds");
    auto shard = [&](size_t i) { return box_string(list[i].first) + " (rank(s) " + rank_list(list[i].second) + ")"; };
    switch (problem.kind) {
      case TilingProblem::Kind::kNone: break;
      case TilingProblem::Kind::kOverlap:
        throw Error("checkpoint::save: shards of tensor '" + key + "' overlap: " + shard(problem.a) + " and " +
                    shard(problem.b));
      case TilingProblem::Kind::kHole:
        throw Error("checkpoint::save: the ranks' shards of tensor '" + key + "' cover " +
                    std::to_string(problem.covered) + " of the " + std::to_string(problem.total) +
                    " elements of its global shape " + shape_string(shape) +
                    (problem.hole_found ? "; no rank holds " + box_string(problem.hole) : std::string()));
      default:
        throw Error("checkpoint::save: tensor '" + key + "': " + describe(problem, whole, shard));
    }
    for (const auto& [b, ranks] : list) {
      const int64_t bytes = numel(b.sizes) * element_size(dtype);
      int writer = ranks.front();
      for (int r : ranks)
        if (load[r] < load[writer]) writer = r;
      load[writer] += bytes;
      plan.writes[writer].push_back({key, b});
    }
  }
  for (int r = 0; r < n; ++r) {
    std::vector<TensorSpec> specs;
    for (const auto& c : plan.writes[r])
      specs.push_back({chunk_name(c.key, c.box.offsets), plan.tensors[c.key].first, c.box.sizes});
    plan.layouts.push_back(layout_safetensors(specs, {{"format", "pt"}, {"fsdpp.rank", std::to_string(r)}}));
  }
  return plan;
}

}  // namespace fsdpp::checkpoint::detail

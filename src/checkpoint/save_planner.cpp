// Who writes what (save_planner.h): every rank's holdings read and checked against each other,
// each tensor's shards checked to tile it, and each distinct chunk given to one of its holders.
#include "checkpoint/save_planner.h"

#include <cstdint>
#include <map>
#include <utility>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/format.h"
#include "checkpoint/tiling.h"

namespace fsdpp::checkpoint::detail {

using nlohmann::json;

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Every rank's plan_of, parsed; throws naming each rank that could not stage its state.
std::vector<json> read_rank_plans(const std::vector<std::string>& plans) {
  std::vector<json> js;
  for (const auto& p : plans) js.push_back(json::parse(p));
  std::string errors;
  for (size_t r = 0; r < js.size(); ++r) {
    const std::string e = without_prefix(js[r]["error"].get<std::string>());
    if (!e.empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
  }
  if (!errors.empty()) throw Error("checkpoint::save: " + errors);
  return js;
}

// A tensor's non-empty boxes, (offsets, sizes), and the ranks holding each.
using BoxHolders = std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, std::vector<int>>;

struct Holdings {
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;  // dtype, shape
  std::map<std::string, BoxHolders> boxes;                                       // by key
};

// What the ranks hold, all together; throws when two ranks give a tensor different dtypes or
// global shapes, or when a key is a tensor on one rank and a plain value on another.
Holdings collect_holdings(std::vector<json> rank_plans) {
  Holdings h;
  std::map<std::string, int> tensor_rank, value_rank;  // first rank that has the key, per kind
  for (int r = 0; r < static_cast<int>(rank_plans.size()); ++r) {
    for (const auto& key : rank_plans[r]["values"]) value_rank.emplace(key.get<std::string>(), r);
    for (const auto& it : rank_plans[r]["items"]) {
      const auto key = it["key"].get<std::string>();
      const auto dtype = it["dtype"].get<std::string>();
      const auto shape = it["shape"].get<std::vector<int64_t>>();
      auto [pos, fresh] = h.tensors.emplace(key, std::make_pair(dtype, shape));
      tensor_rank.emplace(key, r);
      if (!fresh && pos->second != std::make_pair(dtype, shape))
        throw Error("checkpoint::save: tensor '" + key + "' is " + pos->second.first + " " +
                    shape_string(pos->second.second) + " on rank " + std::to_string(tensor_rank[key]) + " but " +
                    dtype + " " + shape_string(shape) + " on rank " + std::to_string(r));
      const auto sizes = it["sizes"].get<std::vector<int64_t>>();
      if (numel(sizes) == 0) continue;  // nothing to write
      h.boxes[key][{it["offsets"].get<std::vector<int64_t>>(), sizes}].push_back(r);
    }
  }
  for (const auto& [key, r] : value_rank)
    if (tensor_rank.count(key))
      throw Error("checkpoint::save: '" + key + "' is a plain value on rank " + std::to_string(r) +
                  " but a tensor on rank " + std::to_string(tensor_rank[key]));
  return h;
}

// A tensor's distinct shards and their holders.
using Shards = std::vector<std::pair<Box, std::vector<int>>>;

// Tensor `key`'s distinct shards, checked to tile its global shape exactly (overflow-checked),
// as load and verify will demand; throws naming the shards and their ranks when they do not.
Shards tiling_shards(const std::string& key, const std::string& dtype, const std::vector<int64_t>& shape,
                     const BoxHolders& by_box) {
  Shards list;
  std::vector<Box> distinct;
  for (const auto& [b, ranks] : by_box) {
    list.push_back({Box{b.first, b.second}, ranks});
    distinct.push_back(list.back().first);
  }
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
  return list;
}

// Each distinct shard is written once (replicas deduplicated), by the holder with the fewest
// bytes so far (`load`, per rank): replicated tensors spread over the ranks.
void assign_writers(const std::string& key, const std::string& dtype, const Shards& shards,
                    std::vector<int64_t>& load, std::vector<std::vector<PlannedChunk>>& writes) {
  for (const auto& [b, ranks] : shards) {
    const int64_t bytes = numel(b.sizes) * element_size(dtype);
    int writer = ranks.front();
    for (int r : ranks)
      if (load[r] < load[writer]) writer = r;
    load[writer] += bytes;
    writes[writer].push_back({key, b});
  }
}

}  // namespace

GlobalPlan plan_writes(const std::vector<std::string>& plans) {
  Holdings holdings = collect_holdings(read_rank_plans(plans));
  GlobalPlan plan;
  plan.tensors = std::move(holdings.tensors);
  std::vector<int64_t> load(plans.size(), 0);
  plan.writes.resize(plans.size());
  for (const auto& [key, tensor] : plan.tensors) {
    const auto& [dtype, shape] = tensor;
    assign_writers(key, dtype, tiling_shards(key, dtype, shape, holdings.boxes[key]), load, plan.writes);
  }
  return plan;
}

}  // namespace fsdpp::checkpoint::detail

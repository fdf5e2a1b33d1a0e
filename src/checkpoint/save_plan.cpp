// The save plan: staging this rank's state, and the plan every rank derives from all of them,
// as DCP splits it: the planner decides who writes what (save_planner.cpp), the storage lays out
// the files (data_file_layout.cpp).
#include "checkpoint/save_plan.h"

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/data_file_layout.h"
#include "checkpoint/save_planner.h"
#include "comm/error_message.h"

namespace fsdpp::checkpoint::detail {

using nlohmann::json;

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
  GlobalPlan plan = plan_writes(plans);
  plan.layouts = data_file_layouts(plan);
  return plan;
}

}  // namespace fsdpp::checkpoint::detail

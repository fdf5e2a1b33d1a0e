#pragma once
// The save plan: what each rank holds (staged), and the plan every rank computes alike from all
// of them: which rank writes each distinct chunk once, where in its file. Shards must tile each
// tensor exactly; a bad state on any rank fails the plan on every rank.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <fsdpp/checkpoint.h>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"

namespace fsdpp::checkpoint::detail {

// One piece this rank saves: a whole tensor (offsets 0) or a shard.
struct Item {
  std::string key, dtype;
  std::vector<int64_t> shape;
  Box box;
  at::Tensor data;  // contiguous, on the CPU; undefined for an empty shard
};

struct Staged {
  std::vector<Item> items;
  std::map<std::string, Entry> values;
  std::string error;  // a bad entry on this rank; reported collectively
};

// This rank's state as items and values; `clone` copies the tensors (async_save).
Staged stage(const State& state, bool clone);
// What this rank holds, as text for an all-gather.
std::string plan_of(const Staged& s);

struct PlannedChunk {
  std::string key;
  Box box;
};

// The same on every rank: computed from every rank's plan.
struct GlobalPlan {
  std::map<std::string, std::pair<std::string, std::vector<int64_t>>> tensors;  // dtype, shape
  std::vector<std::vector<PlannedChunk>> writes;                                 // per rank
  std::vector<SafetensorsLayout> layouts;  // per rank: its data file, `writes` in order
};

// From every rank's plan_of, in rank order: the planner's writes (save_planner.h), then the
// storage's file layouts (data_file_layout.h); throws (alike on every rank) naming keys and ranks.
GlobalPlan make_plan(const std::vector<std::string>& plans);

}  // namespace fsdpp::checkpoint::detail

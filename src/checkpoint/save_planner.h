#pragma once
// The planner's half of the save plan (DCP's SavePlanner.create_global_plan): from every rank's
// holdings, the tensors they agree on and which rank writes each distinct chunk, once. The file
// each rank then writes is the storage's (data_file_layout.h). Private to fsdpp.
#include <string>
#include <vector>

#include "checkpoint/save_plan.h"

namespace fsdpp::checkpoint::detail {

// From every rank's plan_of, in rank order: the plan's `tensors` and `writes` (its `layouts` left
// empty). Throws, alike on every rank, naming the keys and ranks, when a rank could not stage its
// state, when ranks disagree on a key, or when a tensor's shards do not tile it exactly.
GlobalPlan plan_writes(const std::vector<std::string>& plans);

}  // namespace fsdpp::checkpoint::detail

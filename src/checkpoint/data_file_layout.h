#pragma once
// The storage's half of the save plan (DCP's FileSystemWriter): each rank's data file, a
// safetensors file of the chunks the planner gave it (save_planner.h), in that order. Private to
// fsdpp.
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint/save_plan.h"

namespace fsdpp::checkpoint::detail {

// Per rank, from the plan's `tensors` and `writes`: the header bytes and where each chunk goes.
std::vector<SafetensorsLayout> data_file_layouts(const GlobalPlan& plan);

}  // namespace fsdpp::checkpoint::detail

// Each rank's data file laid out (data_file_layout.h): its chunks named "<key>@<offsets>", and
// the rank in its __metadata__.
#include "checkpoint/data_file_layout.h"

#include <map>
#include <string>

#include "checkpoint/format.h"

namespace fsdpp::checkpoint::detail {

std::vector<SafetensorsLayout> data_file_layouts(const GlobalPlan& plan) {
  std::vector<SafetensorsLayout> layouts;
  for (size_t r = 0; r < plan.writes.size(); ++r) {
    std::vector<TensorSpec> specs;
    for (const auto& c : plan.writes[r])
      specs.push_back({chunk_name(c.key, c.box.offsets), plan.tensors.at(c.key).first, c.box.sizes});
    layouts.push_back(layout_safetensors(specs, {{"format", "pt"}, {"fsdpp.rank", std::to_string(r)}}));
  }
  return layouts;
}

}  // namespace fsdpp::checkpoint::detail

// Integers from untrusted JSON, range-checked before conversion.
#include "checkpoint/json_numbers.h"

#include <fsdpp/error.h>

namespace fsdpp::checkpoint::detail {

using nlohmann::json;

int64_t int64_of(const json& j, const std::string& name) {
  const bool fits = j.is_number_integer() &&
                    (!j.is_number_unsigned() || j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX));
  if (!fits) throw Error("\"" + name + "\" is " + j.dump() + ", not a 64-bit integer");
  return j.get<int64_t>();
}

std::vector<int64_t> int64_list(const json& j, const std::string& name) {
  if (!j.is_array()) throw Error("\"" + name + "\" is " + j.dump() + ", not a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : j) out.push_back(int64_of(x, name));
  return out;
}

}  // namespace fsdpp::checkpoint::detail

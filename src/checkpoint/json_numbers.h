#pragma once
// Integers read from a file's JSON (metadata.json, a safetensors header), taken only when they
// are JSON integers that fit int64. nlohmann's get<int64_t> would convert anything numeric:
// 2.5 becomes 2, 2^63 wraps negative, and 1e40 is a float-to-integer overflow (undefined
// behaviour; in practice INT64_MIN).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpp::checkpoint::detail {

// Throws fsdpp::Error naming `name` and the value when `j` is not such an integer.
int64_t int64_of(const nlohmann::json& j, const std::string& name);
// A JSON list of such integers.
std::vector<int64_t> int64_list(const nlohmann::json& j, const std::string& name);

}  // namespace fsdpp::checkpoint::detail

#pragma once
// An Error's message without its "fsdpp: " (any other text as it is), to be wrapped in another
// Error or listed among several problems.
#include <string>

namespace fsdpp::detail {

inline std::string without_prefix(const std::string& what) {
  const std::string prefix = "fsdpp: ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

}  // namespace fsdpp::detail

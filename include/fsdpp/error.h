#pragma once
// fsdpp's one exception type: every misuse and every failed collective throws it,
// with a message that names what was wrong (a key, a shape, a rank, a file).
#include <stdexcept>
#include <string>

namespace fsdpp {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("fsdpp: " + what) {}
};

}  // namespace fsdpp

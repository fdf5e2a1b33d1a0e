#include "common/shape_string.h"

#include <sstream>

namespace fsdpp::detail {

std::string shape_string(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

}  // namespace fsdpp::detail

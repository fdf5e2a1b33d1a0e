#pragma once
// How every fsdpp error message writes a shape or an offset list: "[4, 8]".
#include <string>

#include <c10/util/ArrayRef.h>

namespace fsdpp::detail {

std::string shape_string(c10::IntArrayRef sizes);

}  // namespace fsdpp::detail

#pragma once
// The message of the fsdpp::Error a call throws, or "no error": tests match it against what
// the error must name.
#include <string>

#include <fsdpp/error.h>

namespace fsdpp::testing {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace fsdpp::testing

#pragma once
// Pieces of fsdpp's error messages. Private to fsdpp.
#include <c10/util/Exception.h>

#include <cstdlib>

#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "common/store_secret.h"

namespace fsdpp::detail {

// c10's messages carry a C++ backtrace that buries the line a user needs (and may name a
// function with "timeout" in it): the message without it, and without the store's secret
// (c10d names the keys it waited for, and they start with it).
inline std::string message_without_backtrace(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const char* secret = std::getenv(kStoreSecretVariable);
  return redact_store_secret(c10_error ? c10_error->what_without_backtrace() : e.what(), secret ? secret : "");
}

// "[0, 2, 3]"
inline std::string list_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

}  // namespace fsdpp::detail

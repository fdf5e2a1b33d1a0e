#pragma once
// Which addresses only this machine reaches. Pure: fsdpp-run (which does not link fsdpp) uses it too.
#include <string>

namespace fsdpp {

inline bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace fsdpp

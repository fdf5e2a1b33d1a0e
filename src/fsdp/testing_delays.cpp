#include "fsdp/testing_delays.h"

#include <chrono>
#include <thread>

namespace fsdpp::detail {

FSDPTestingDelays& testing_delays() {
  static FSDPTestingDelays delays;
  return delays;
}

void testing_delay(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace fsdpp::detail

// The process-level settings of process_setup.h, and torchrun's per-node variables
// (get_local_rank, get_local_world_size).
#include "comm/process_setup.h"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>

#include <fsdpp/error.h>
#include <fsdpp/process_group.h>

namespace fsdpp {
namespace detail {

int env_int(const char* name, int fallback, bool required, const std::string& why) {
  const char* value = std::getenv(name);
  if (!value || !*value) {
    if (required) throw Error("environment variable " + std::string(name) + " is not set (" + why + ")");
    return fallback;
  }
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > (1 << 30))
    throw Error("environment variable " + std::string(name) + "='" + value +
                "' is not a non-negative integer");
  return static_cast<int>(parsed);
}

std::chrono::milliseconds timeout_from(std::chrono::milliseconds option) {
  const char* value = std::getenv("FSDPP_TIMEOUT_SECONDS");
  if (!value || !*value) return option;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  if (*end != '\0' || !(seconds > 0 && seconds <= 1e7))  // also rejects NaN
    throw Error("environment variable FSDPP_TIMEOUT_SECONDS='" + std::string(value) +
                "' is not a number of seconds in (0, 1e7]");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

bool check_collectives_from(std::optional<bool> option) {
  if (option) return *option;
  const char* env = std::getenv("FSDPP_CHECK_COLLECTIVES");
  return !(env && std::string(env) == "0");
}

bool torch_nccl_blocking_wait() {
  const char* v = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
}

void ignore_sigpipe_as_python_does() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

}  // namespace detail

int get_local_rank() { return detail::env_int("LOCAL_RANK", 0, false, ""); }
int get_local_world_size() { return detail::env_int("LOCAL_WORLD_SIZE", 1, false, ""); }

}  // namespace fsdpp

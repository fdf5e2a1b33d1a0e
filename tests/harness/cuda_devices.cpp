#include "harness/cuda_devices.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include "compat/cuda_runtime.h"

namespace fsdpp::testing {

int cuda_devices_seen_by_ranks() {
  static const int count = [] {
    const pid_t child = fork();
    if (child == 0) _exit(std::min(compat::cuda_device_count(), 100));
    int status = 0;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
  }();
  return count;
}

}  // namespace fsdpp::testing

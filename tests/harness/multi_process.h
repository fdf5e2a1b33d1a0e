#pragma once
// Runs a test body on several ranks, one process each, the way PyTorch's MultiProcessTestCase
// does: the test process forks once per rank, and each child runs the body.
// Ranks meet on a FileStore in a fresh temp dir. Each rank's gtest failures and exceptions
// come back to the parent test, a deadline kills a hung run (naming the ranks that hung),
// and no process is left behind.
#include <chrono>
#include <functional>
#include <string>

#include <fsdpp/process_group.h>

namespace fsdpp::testing {

struct RankContext {
  int rank = 0;
  int world_size = 1;
  ProcessGroup world;    // empty when RunOptions::init_process_group is false
  std::string temp_dir;  // shared by the ranks of this run, removed afterwards
  std::string store_path;
};

// The backend run_ranks uses unless a test names one: FSDPP_TEST_BACKEND, or "gloo". CTest runs
// some suites again under "nccl-contract" (tests/CMakeLists.txt), through the device path, with
// each rank's device collectives delayed by FSDPP_TEST_COLLECTIVE_DELAY_US.
std::string default_test_backend();

struct RunOptions {
  std::chrono::seconds deadline{120};
  // Collectives time out well before the deadline, so a hang names its collective.
  std::chrono::milliseconds collective_timeout{60000};
  bool init_process_group = true;
  std::string backend = default_test_backend();  // InitProcessGroupOptions::backend
  bool check_collectives = true;
  // Extra environment for the ranks ("NAME=value").
  std::vector<std::string> env;
};

// Parametrize over world sizes with TEST_P.
void run_ranks(int world_size, const std::function<void(RankContext&)>& body, const RunOptions& options = {});

}  // namespace fsdpp::testing

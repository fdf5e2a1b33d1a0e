// A rank of a small FSDP training job, for the hung-rank tests (test_hung_rank.cpp), run
// under fsdpp-run or started by hand with torchrun's environment. It trains a tiny model step
// after step; once it has done 3 steps it publishes its pid as $D/pid.$RANK so the test can
// stop it. It ends, exit code 0, after STEPS steps (default: practically never).
//   LATE_RANK=r: rank r sleeps 60 s before joining (a rank that never arrives).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// Atomically, so the test never reads half a pid.
void publish_pid(int rank) {
  const std::string dir = std::getenv("D") ? std::getenv("D") : ".";
  const std::string path = dir + "/pid." + std::to_string(rank);
  std::ofstream(path + ".tmp") << ::getpid() << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

}  // namespace

int main() {
  const int rank = env_int("RANK", 0);
  if (rank == env_int("LATE_RANK", -1)) std::this_thread::sleep_for(std::chrono::seconds(60));
  auto world = fsdpp::init_process_group();
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4));
  auto model = fsdpp::fully_shard(net);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01));
  const int steps = env_int("STEPS", 1 << 30);
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 * step + rank);
    opt.zero_grad();
    model->forward(torch::randn({8, 16})).pow(2).mean().backward();
    opt.step();
    if (step == 3) publish_pid(rank);
    // Leave the 2 cores to the other ranks and the test: the steps need not be fast.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (rank == 0) std::printf("trained %d steps\n", steps);
  return 0;
}

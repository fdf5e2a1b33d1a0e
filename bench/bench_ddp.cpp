// Step time of the same MLP trained three ways: one process on the global batch, fsdpp's DDP,
// and (bench_ddp.py) PyTorch's Python DDP on the same Gloo backend. run_ddp_bench.sh runs
// them all in one go and prints the ratios.
//   single:  bench_ddp --mode single --global-batch 64
//   DDP:     fsdpp-run --nproc-per-node 2 bench_ddp --mode ddp --global-batch 64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "mlp.h"

int main(int argc, char** argv) {
  CLI::App app{"fsdpp DDP step time"};
  std::string mode = "ddp";
  int64_t hidden = 1024, layers = 4, global_batch = 64;
  int steps = 30, warmup = 5;
  app.add_option("--mode", mode, "single or ddp")->check(CLI::IsMember({"single", "ddp"}));
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--global-batch", global_batch);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);  // one core per rank, as OMP_NUM_THREADS=1 under the launchers

  int rank = 0, world = 1;
  fsdpp::ProcessGroup group;
  if (mode == "ddp") {
    group = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
    rank = group.rank();
    world = group.size();
  }
  torch::manual_seed(0);
  MLP model(hidden, layers);
  std::unique_ptr<fsdpp::DistributedDataParallel<MLPImpl>> ddp;
  if (mode == "ddp") ddp = std::make_unique<fsdpp::DistributedDataParallel<MLPImpl>>(model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const int64_t batch = global_batch / world;
  torch::Tensor x = torch::randn({batch, hidden}), y = torch::randn({batch, hidden});

  std::vector<double> times;
  for (int step = 0; step < warmup + steps; ++step) {
    if (mode == "ddp") fsdpp::barrier(group);
    auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    torch::Tensor out = ddp ? ddp->forward(x) : model->forward(x);
    torch::mse_loss(out, y).backward();
    optimizer.step();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step >= warmup) times.push_back(seconds);
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  if (mode == "ddp") {
    torch::Tensor t = torch::tensor({median}, torch::kDouble);
    fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX, group);
    median = t.item<double>();
  }
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  if (rank == 0)
    std::printf("fsdpp %s world=%d params=%lld global_batch=%lld median_step_ms=%.2f\n", mode.c_str(), world,
                static_cast<long long>(params), static_cast<long long>(global_batch), median * 1e3);
  return 0;
}

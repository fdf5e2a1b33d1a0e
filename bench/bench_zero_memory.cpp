// Per-rank optimizer-state bytes of Adam under ZeroRedundancyOptimizer vs a plain Adam, on the
// same MLP in one run: the memory the first step allocates and keeps (exp_avg, exp_avg_sq, step).
//   fsdpp-run --nproc-per-node 4 bench_zero_memory
#include <cstdio>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "mlp.h"

namespace {

// Bytes the optimizer's first step leaves allocated: its state.
template <typename Optimizer>
int64_t state_bytes_after_first_step(MLP& model, Optimizer& optimizer) {
  torch::Tensor x = torch::randn({8, model->body[0]->as<torch::nn::Linear>()->weight.size(1)});
  optimizer.zero_grad();
  model->forward(x).sum().backward();
  const int64_t before = fsdpp::memory_stats().current_bytes;
  optimizer.step();
  return fsdpp::memory_stats().current_bytes - before;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp ZeRO optimizer-state memory"};
  int64_t hidden = 512, layers = 8;
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  CLI11_PARSE(app, argc, argv);
  auto world = fsdpp::init_process_group();
  torch::manual_seed(0);
  MLP plain_model(hidden, layers), zero_model(hidden, layers);
  torch::optim::Adam plain(plain_model->parameters(), torch::optim::AdamOptions(1e-3));
  fsdpp::ZeroRedundancyOptimizer<torch::optim::Adam> zero(zero_model->parameters(), torch::optim::AdamOptions(1e-3));
  const int64_t plain_bytes = state_bytes_after_first_step(plain_model, plain);
  const int64_t zero_bytes = state_bytes_after_first_step(zero_model, zero);
  torch::Tensor all = torch::tensor({zero_bytes}, torch::kLong);
  torch::Tensor gathered = torch::empty({world.size()}, torch::kLong);
  fsdpp::all_gather_into_tensor(gathered, all);
  if (world.rank() == 0) {
    int64_t params = 0;
    for (const auto& p : plain_model->parameters()) params += p.numel();
    std::printf("N=%d params=%lld: plain Adam state %lld bytes per rank\n", world.size(), static_cast<long long>(params),
                static_cast<long long>(plain_bytes));
    for (int r = 0; r < world.size(); ++r)
      std::printf("  rank %d ZeRO Adam state %lld bytes = %.3f of plain (1/N = %.3f)\n", r,
                  static_cast<long long>(gathered[r].item<int64_t>()), double(gathered[r].item<int64_t>()) / plain_bytes,
                  1.0 / world.size());
  }
  return 0;
}

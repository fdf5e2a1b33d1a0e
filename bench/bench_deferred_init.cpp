// Deferred vs eager initialization of bench_fsdp's transformer under FSDP (each block a unit):
// per rank, the tensor memory peak while building, wrapping and initializing (eager holds the
// whole model first; deferred the shards and one unit), the time that takes, and the median
// training step of each (the same arithmetic once initialized), alternated over --rounds. With
// --limit-over-params X the
// deferred model is built and trained under fsdpp::set_memory_limit(X x the parameters' bytes).
// Run under fsdpp-run; rank 0 prints the maxima over ranks.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "bench_util.h"
#include "step_timer.h"

using namespace fsdpp::bench;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerBlockImpl;

namespace {

double max_over_ranks(double v, const fsdpp::ProcessGroup& world) {
  at::Tensor t = at::tensor(std::vector<double>{v}, at::kDouble);
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX, world);
  return t.item<double>();
}

double vm_hwm_mib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  return -1;
}

struct Measured {
  double init_peak = 0, init_seconds = 0, step_seconds = 0, step_peak = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp deferred vs eager initialization under FSDP: init peak and time, step time"};
  TransformerBenchArgs args;
  add_transformer_options(app, args);
  app.add_option("--rounds", args.rounds);
  double limit_over_params = 0;
  app.add_option("--limit-over-params", limit_over_params, "memory limit per rank for the deferred run, x parameter bytes");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);
  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int rank = world.rank(), n = world.size();
  torch::manual_seed(rank);
  at::Tensor tokens = torch::randint(args.model.vocab_size, {args.local_batch, args.model.max_seq_len}, torch::kLong);
  const auto options = fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
  int64_t param_bytes = 0;
  {
    auto meta = fsdpp::deferred_init([&] { return Transformer(args.model); });
    for (const auto& p : meta->parameters()) param_bytes += p.numel() * 4;
  }

  auto measure = [&](bool deferred) {
    Measured m;
    fsdpp::empty_cache();
    const int64_t base = fsdpp::memory_stats().current_bytes;
    if (deferred && limit_over_params > 0)
      fsdpp::set_memory_limit(base + static_cast<int64_t>(limit_over_params * static_cast<double>(param_bytes)));
    fsdpp::reset_peak_memory_stats();
    fsdpp::barrier(world);
    const auto t0 = std::chrono::steady_clock::now();
    torch::manual_seed(0);
    auto model = fsdpp::fully_shard(deferred ? fsdpp::deferred_init([&] { return Transformer(args.model); })
                                             : Transformer(args.model),
                                    options);
    if (deferred)
      fsdpp::materialize_module(*model, fsdpp::MaterializeOptions().param_init_fn(fsdpp::examples::init_transformer_module));
    m.init_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m.init_peak = static_cast<double>(fsdpp::memory_stats().peak_bytes - base);
    torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
    auto step = [&] {
      opt.zero_grad();
      fsdpp::examples::language_model_loss(model->forward(tokens), tokens).backward();
      opt.step();
    };
    fsdpp::reset_peak_memory_stats();
    m.step_seconds = median_step(step, args.warmup, args.steps, &world);
    m.step_peak = static_cast<double>(fsdpp::memory_stats().peak_bytes - base);
    fsdpp::set_memory_limit(0);
    return Measured{max_over_ranks(m.init_peak, world), max_over_ranks(m.init_seconds, world), m.step_seconds,
                    max_over_ranks(m.step_peak, world)};
  };
  // Alternated, the order swapped every round (the second of a pair runs on a warmer allocator
  // cache); each variant's median step over the rounds.
  std::vector<Measured> eagers, deferreds;
  for (int round = 0; round < args.rounds; ++round)
    for (bool deferred_now : {round % 2 == 1, round % 2 == 0}) (deferred_now ? deferreds : eagers).push_back(measure(deferred_now));
  auto median_of = [](std::vector<Measured> ms) {
    std::sort(ms.begin(), ms.end(), [](const Measured& a, const Measured& b) { return a.step_seconds < b.step_seconds; });
    return ms[ms.size() / 2];
  };
  const Measured eager = median_of(eagers), deferred = median_of(deferreds);
  const double hwm = max_over_ranks(vm_hwm_mib(), world);
  if (rank == 0) {
    std::printf("bench_deferred_init: N = %d, %lld layers, dim %lld, vocab %lld; parameters %.2f MiB (float32); %s\n", n,
                static_cast<long long>(args.model.n_layers), static_cast<long long>(args.model.dim),
                static_cast<long long>(args.model.vocab_size), mib(param_bytes), blas_description().c_str());
    if (limit_over_params > 0)
      std::printf("deferred run under a memory limit of %.2f x the parameters = %.2f MiB per rank\n", limit_over_params,
                  mib(limit_over_params * param_bytes));
    for (const auto& [name, m] : {std::pair{"eager", eager}, std::pair{"deferred", deferred}})
      std::printf("%-8s: init peak %.3f MiB (%.3f x parameters), init %.1f ms; step %.2f ms, step peak %.3f MiB (%.3f x)\n",
                  name, mib(m.init_peak), m.init_peak / param_bytes, 1e3 * m.init_seconds, 1e3 * m.step_seconds,
                  mib(m.step_peak), m.step_peak / param_bytes);
    std::printf("deferred / eager: init peak %.3f, init time %.3f, step time %.3f; VmHWM (max over ranks) %.0f MiB\n",
                deferred.init_peak / eager.init_peak, deferred.init_seconds / eager.init_seconds,
                deferred.step_seconds / eager.step_seconds, hwm);
  }
  fsdpp::destroy_process_group();
  return 0;
}

// Where a training step's CPU time goes when the ranks share a few cores (issue 14): FSDP,
// FSDP without resharding after forward (2/3 of FSDP's bytes, as many as DDP's), DDP, and
// each rank's step alone with no communication, on bench_fsdp's transformer. Per variant:
//  - wall: the slowest rank's median step;
//  - CPU per step summed over ranks (getrusage: every thread of the process), split into the
//    training threads (compute, FSDP's copies and bookkeeping) and the rest (the comm threads
//    and Gloo's own, i.e. moving the bytes);
//  - bytes sent per step per rank (CommDebugMode).
// On a machine with C cores a step can take no less than its CPU time over C, so when DDP
// already keeps the cores busy, FSDP's step ratio to DDP is at least the ratio of their CPU.
// CPU time is also far less sensitive than wall time to other load on the machine.
//   fsdpp-run --nproc-per-node 2 bench_step_cpu --layers 4 --dim 256
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "bench_util.h"
#include "step_timer.h"
#include "transformer.h"

namespace {

using fsdpp::bench::add_transformer_options;
using fsdpp::bench::mib;
using fsdpp::bench::TransformerBenchArgs;
using fsdpp::examples::language_model_loss;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerBlockImpl;

double cpu_seconds(int who) {
  rusage usage{};
  getrusage(who, &usage);
  auto seconds = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

struct Result {
  std::vector<double> wall, process_cpu, training_cpu;  // per round; CPU summed over ranks
  double bytes_sent = 0;                                  // per step, on rank 0
};

enum class Kind { kFsdp, kFsdpNoReshard, kDdp, kLocal };

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU time of a training step per rank: FSDP, FSDP without reshard, DDP, no communication"};
  TransformerBenchArgs args;
  add_transformer_options(app, args);
  app.add_option("--rounds", args.rounds);
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int rank = world.rank(), n = world.size();
  torch::manual_seed(rank);
  at::Tensor tokens = torch::randint(args.model.vocab_size, {args.local_batch, args.model.max_seq_len}, torch::kLong);
  at::Tensor targets = torch::randint(args.model.vocab_size, {args.local_batch, args.model.max_seq_len}, torch::kLong);

  const std::vector<std::pair<std::string, Kind>> variants{{"FSDP", Kind::kFsdp},
                                                           {"FSDP, no reshard after forward", Kind::kFsdpNoReshard},
                                                           {"DDP", Kind::kDdp},
                                                           {"no communication", Kind::kLocal}};
  std::vector<Result> results(variants.size());
  for (int round = 0; round < args.rounds; ++round)
    for (size_t v = 0; v < variants.size(); ++v) {
      const Kind kind = variants[v].second;
      torch::manual_seed(0);
      Transformer plain(args.model);
      std::function<at::Tensor()> forward;
      std::vector<at::Tensor> params;
      fsdpp::FullyShardedDataParallel<fsdpp::examples::TransformerImpl> fsdp_model{nullptr};
      std::unique_ptr<fsdpp::DistributedDataParallel<fsdpp::examples::TransformerImpl>> ddp;
      if (kind == Kind::kFsdp || kind == Kind::kFsdpNoReshard) {
        fsdp_model = fsdpp::fully_shard(plain, fsdpp::FullyShardOptions()
                                                   .auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>())
                                                   .reshard_after_forward(kind == Kind::kFsdp));
        forward = [&] { return fsdp_model->forward(tokens); };
        params = fsdp_model->parameters();
      } else if (kind == Kind::kDdp) {
        ddp = std::make_unique<fsdpp::DistributedDataParallel<fsdpp::examples::TransformerImpl>>(plain);
        forward = [&] { return ddp->forward(tokens); };
        params = plain->parameters();
      } else {
        forward = [&] { return plain->forward(tokens); };
        params = plain->parameters();
      }
      torch::optim::Adam opt(params, torch::optim::AdamOptions(1e-4));
      auto step = [&] {
        opt.zero_grad();
        language_model_loss(forward(), targets).backward();
        opt.step();
      };
      step();  // Adam state exists from here on
      Result& r = results[v];
      if (round == 0) {
        fsdpp::CommDebugMode comm;
        step();
        r.bytes_sent = comm.bytes_sent("all_gather_into_tensor") + comm.bytes_sent("reduce_scatter_tensor") +
                       comm.bytes_sent("all_reduce");
      }
      const double process0 = cpu_seconds(RUSAGE_SELF), training0 = cpu_seconds(RUSAGE_THREAD);
      // The local variant times each rank alone (no barrier between its steps): ranks share
      // the cores as they do in the other variants.
      const double wall =
          fsdpp::bench::median_step(step, args.warmup, args.steps, kind == Kind::kLocal ? nullptr : &world);
      at::Tensor cpu = at::tensor(
          std::vector<double>{(cpu_seconds(RUSAGE_SELF) - process0) / (args.warmup + args.steps),
                              (cpu_seconds(RUSAGE_THREAD) - training0) / (args.warmup + args.steps)},
          at::kDouble);
      fsdpp::all_reduce(cpu, fsdpp::ReduceOp::SUM, world);
      at::Tensor slowest = at::tensor(std::vector<double>{wall}, at::kDouble);
      fsdpp::all_reduce(slowest, fsdpp::ReduceOp::MAX, world);
      r.process_cpu.push_back(cpu[0].item<double>());
      r.training_cpu.push_back(cpu[1].item<double>());
      r.wall.push_back(slowest.item<double>());
    }
  if (rank == 0) {
    std::printf("transformer: %lld layers, dim %lld; N = %d, local batch %lld x %lld; %d rounds; %s\n",
                static_cast<long long>(args.model.n_layers), static_cast<long long>(args.model.dim), n,
                static_cast<long long>(args.local_batch), static_cast<long long>(args.model.max_seq_len), args.rounds,
                fsdpp::bench::blas_description().c_str());
    std::printf("CPU ms are per step, summed over the %d ranks; 'other threads' = comm threads and Gloo's\n", n);
    const Result& ddp = results[2];
    for (size_t v = 0; v < variants.size(); ++v) {
      const Result& r = results[v];
      std::printf("%-31s bytes sent %.3f MiB per rank\n", variants[v].first.c_str(), mib(r.bytes_sent));
      for (int i = 0; i < args.rounds; ++i) {
        const double process = r.process_cpu[i], training = r.training_cpu[i];
        std::printf("  round %d: wall %.2f ms (%.3fx DDP); CPU %.2f ms (%.3fx DDP) = training threads %.2f + other "
                    "threads %.2f; CPU / wall %.2f cores\n",
                    i + 1, r.wall[i] * 1e3, r.wall[i] / ddp.wall[i], process * 1e3, process / ddp.process_cpu[i],
                    training * 1e3, (process - training) * 1e3, process / r.wall[i]);
      }
    }
  }
  fsdpp::destroy_process_group();
  return 0;
}

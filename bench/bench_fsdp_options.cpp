// FSDP's training options on bench_fsdp's transformer, each against plain float32 FSDP in the
// same run (rounds alternate the variants, so a noisy machine shifts them alike):
//  - mixed precision (bf16 compute with float32 or bf16 reduction), activation checkpointing
//    of every block and, at an even N >= 4, HSDP on an (N/2, 2) mesh: all-gather,
//    reduce-scatter and all-reduce bytes per step (CommDebugMode), median step time, peak
//    tensor memory of a step above what is held between steps.
// --hsdp-only keeps float32 FSDP and HSDP; --trace DIR writes a Chrome trace of two steps of
// each variant per rank (DIR/<variant>/rank-<R>.json, after the timed rounds).
//   fsdpp-run --nproc-per-node 2 bench_fsdp_options --layers 4 --dim 256
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

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


// "fp32, HSDP (N/2 x 2)" -> "fp32-hsdp-n-2-x-2"
std::string slug(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool alnum = std::isalnum(static_cast<unsigned char>(c)) != 0;
    if (alnum) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else if (!out.empty() && out.back() != '-') out += '-';
  }
  if (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

struct Variant {
  std::string name;
  fsdpp::FullyShardOptions options;
  bool activation_checkpointing = false;
};

struct Result {
  double all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0, transient_peak = 0;
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp FSDP options (mixed precision, activation checkpointing) vs float32 FSDP: wire bytes, memory, step time"};
  TransformerBenchArgs args;
  add_transformer_options(app, args);
  app.add_option("--rounds", args.rounds);
  bool hsdp_only = false;
  app.add_flag("--hsdp-only", hsdp_only, "Only float32 FSDP and HSDP (N >= 4, even)");
  std::string trace_dir;
  app.add_option("--trace", trace_dir,
                 "Write a Chrome trace of two steps of each variant per rank to DIR/<variant>/rank-<R>.json "
                 "(scripts/merge-chrome-traces.py merges them)");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int rank = world.rank(), n = world.size();
  torch::manual_seed(rank);
  at::Tensor tokens = torch::randint(args.model.vocab_size, {args.local_batch, args.model.max_seq_len}, torch::kLong);
  at::Tensor targets = torch::randint(args.model.vocab_size, {args.local_batch, args.model.max_seq_len}, torch::kLong);

  const auto blocks = fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
  auto with_mp = [&](at::ScalarType reduce) {
    return fsdpp::FullyShardOptions(blocks).mp_policy(
        fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(reduce));
  };
  // FSDP around each checkpoint-wrapped block.
  const auto checkpointed_blocks = fsdpp::FullyShardOptions().auto_wrap_policy(
      fsdpp::ModuleWrapPolicy<fsdpp::CheckpointWrapperImpl<TransformerBlockImpl>>());
  std::vector<Variant> variants{{"fp32", blocks},
                                {"bf16 compute, fp32 reduce", with_mp(at::kFloat)},
                                {"bf16 compute, bf16 reduce", with_mp(at::kBFloat16)},
                                {"fp32, blocks checkpointed", checkpointed_blocks, true}};
  if (n >= 4 && n % 2 == 0)
    variants.push_back({"fp32, HSDP (N/2 x 2)",
                        fsdpp::FullyShardOptions(blocks).mesh(fsdpp::init_device_mesh(world, {n / 2, 2}))});
  if (hsdp_only) variants.erase(variants.begin() + 1, variants.begin() + 4);
  std::vector<Result> results(variants.size());
  for (int round = 0; round < args.rounds; ++round)
    for (size_t v = 0; v < variants.size(); ++v) {
      torch::manual_seed(0);
      Transformer plain(args.model);
      if (variants[v].activation_checkpointing)
        fsdpp::apply_activation_checkpointing(*plain, fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
      auto model = fsdpp::fully_shard(plain, variants[v].options);
      torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
      auto step = [&] {
        opt.zero_grad();
        at::Tensor loss;
        {
          fsdpp::profiler::record_function span("forward");
          loss = language_model_loss(model->forward(tokens).to(at::kFloat), targets);
        }
        {
          fsdpp::profiler::record_function span("backward");
          loss.backward();
        }
        fsdpp::profiler::record_function span("optimizer");
        opt.step();
      };
      step();  // Adam state exists from here on
      Result& r = results[v];
      if (round == 0) {
        fsdpp::reset_peak_memory_stats();
        const int64_t base = fsdpp::memory_stats().current_bytes;
        fsdpp::CommDebugMode comm;
        step();
        r.transient_peak = fsdpp::memory_stats().peak_bytes - base;
        r.all_gather_bytes = comm.bytes_sent("all_gather_into_tensor");
        r.reduce_scatter_bytes = comm.bytes_sent("reduce_scatter_tensor");
        r.all_reduce_bytes = comm.bytes_sent("all_reduce");
      }
      r.times.push_back(fsdpp::bench::median_step(step, args.warmup, args.steps, &world));
      if (!trace_dir.empty() && round == args.rounds - 1) {
        const std::string dir = trace_dir + "/" + slug(variants[v].name);
        std::filesystem::create_directories(dir);
        fsdpp::barrier(world);
        fsdpp::profiler::start();
        for (int i = 0; i < 2; ++i) {
          fsdpp::profiler::record_function span("step " + std::to_string(i));
          step();
        }
        fsdpp::profiler::stop();
        fsdpp::profiler::export_chrome_trace(dir + "/rank-" + std::to_string(rank) + ".json");
      }
    }
  if (rank == 0) {
    std::printf("transformer: %lld layers, dim %lld; N = %d, local batch %lld x %lld; %d rounds\n",
                static_cast<long long>(args.model.n_layers), static_cast<long long>(args.model.dim), n,
                static_cast<long long>(args.local_batch), static_cast<long long>(args.model.max_seq_len), args.rounds);
    const Result& base = results[0];
    for (size_t v = 0; v < variants.size(); ++v) {
      const Result& r = results[v];
      std::printf("%-28s all-gather %.3f MiB (%.3fx), reduce-scatter %.3f MiB (%.3fx), all-reduce %.3f MiB, step peak above held %.3f MiB (%.3fx)\n",
                  variants[v].name.c_str(), mib(r.all_gather_bytes), r.all_gather_bytes / base.all_gather_bytes,
                  mib(r.reduce_scatter_bytes), r.reduce_scatter_bytes / base.reduce_scatter_bytes,
                  mib(r.all_reduce_bytes), mib(r.transient_peak), r.transient_peak / base.transient_peak);
      std::printf("%-28s step ms per round:", "");
      for (size_t i = 0; i < r.times.size(); ++i)
        std::printf(" %.2f (%.3fx)", r.times[i] * 1e3, r.times[i] / base.times[i]);
      std::printf("\n");
    }
  }
  fsdpp::destroy_process_group();
  return 0;
}

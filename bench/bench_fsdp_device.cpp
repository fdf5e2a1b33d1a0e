// fsdpp's FSDP step on a CUDA device (issue 37's GPU benchmark), the counterpart of
// `bench_fsdp.py --device cuda`: examples/transformer.h's model with every block a unit and the
// root, bfloat16 parameters with a float32 reduction (or float32), Adam, one local batch of random
// tokens; the median step time (the GPU synchronized around each step), the peak of the CUDA
// caching allocator over a step, tokens per second and the model FLOPs utilization against a
// stated dense bf16 peak. Run it under fsdpp-run or torchrun, one rank per GPU (NCCL), e.g.
//   fsdpp-run --nproc-per-node 1 build/bench/bench_fsdp_device --layers 12 --dim 1024 --seq 512
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "step_timer.h"
#include "transformer.h"

using fsdpp::examples::language_model_loss;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerArgs;
using fsdpp::examples::TransformerBlockImpl;

int main(int argc, char** argv) {
  TransformerArgs model_args;
  model_args.n_layers = 4;  // bench_fsdp's transformer by default
  model_args.dim = 256;
  model_args.n_heads = 4;
  model_args.vocab_size = 1024;
  model_args.max_seq_len = 32;
  int64_t local_batch = 2;
  int steps = 20, warmup = 5;
  std::string param_dtype = "bf16", backend = "nccl";
  double peak_tflops = 989;  // H100 / H200 SXM, dense bfloat16
  CLI::App app{"fsdpp FSDP on a CUDA device: step time, peak memory, tokens/s and MFU"};
  app.add_option("--layers", model_args.n_layers);
  app.add_option("--dim", model_args.dim);
  app.add_option("--heads", model_args.n_heads);
  app.add_option("--vocab", model_args.vocab_size);
  app.add_option("--seq", model_args.max_seq_len);
  app.add_option("--local-batch", local_batch);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--param-dtype", param_dtype)->check(CLI::IsMember({"bf16", "fp32"}));
  app.add_option("--backend", backend, "init_process_group's backend (nccl; gloo to share one GPU)");
  app.add_option("--peak-tflops", peak_tflops, "the GPU's dense peak for the MFU (989: H100 / H200 bf16)");
  CLI11_PARSE(app, argc, argv);
  const int devices = static_cast<int>(torch::cuda::device_count());
  if (devices == 0) {
    std::fprintf(stderr, "bench_fsdp_device: needs a CUDA device (this process sees none)\n");
    return 2;
  }

  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().backend(backend));
  const int rank = world.rank();
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(fsdpp::get_local_rank() % devices));
  torch::manual_seed(rank);
  const auto on_device = torch::TensorOptions().dtype(torch::kLong).device(device);
  const at::Tensor tokens = torch::randint(model_args.vocab_size, {local_batch, model_args.max_seq_len}).to(on_device);
  const at::Tensor targets = torch::randint(model_args.vocab_size, {local_batch, model_args.max_seq_len}).to(on_device);
  torch::manual_seed(0);
  Transformer plain(model_args);
  plain->to(device);
  int64_t params = 0;
  for (const auto& p : plain->parameters()) params += p.numel();
  fsdpp::FullyShardOptions options;
  if (param_dtype == "bf16")
    options.mp_policy(fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  auto model = fsdpp::fully_shard(plain, options.auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>()));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-4));
  auto step = [&] {
    opt.zero_grad();
    language_model_loss(model->forward(tokens), targets).backward();
    opt.step();
    torch::cuda::synchronize(device.index());
  };
  step();
  fsdpp::reset_peak_memory_stats(device);
  const int64_t before = fsdpp::memory_stats(device).current_bytes;
  step();
  const fsdpp::MemoryStats after = fsdpp::memory_stats(device);
  const double median = fsdpp::bench::median_step(step, warmup, steps, &world);

  const double tokens_per_step = double(local_batch) * model_args.max_seq_len * world.size();
  const double flops = fsdpp::examples::training_flops_per_token(model_args, params) * tokens_per_step;
  const double mfu = flops / median / world.size() / (peak_tflops * 1e12);
  if (rank == 0)
    std::printf("fsdpp %s world=%d layers=%lld dim=%lld seq=%lld local_batch=%lld params=%.1fM dtype=%s "
                "median_step_ms=%.3f peak_step_MiB=%.1f held_MiB=%.1f tokens_per_s=%.0f mfu=%.4f (of %.0f TFLOP/s)\n",
                device.str().c_str(), world.size(), static_cast<long long>(model_args.n_layers),
                static_cast<long long>(model_args.dim), static_cast<long long>(model_args.max_seq_len),
                static_cast<long long>(local_batch), params / 1e6, param_dtype.c_str(), median * 1e3,
                after.peak_bytes / 1048576.0, before / 1048576.0, tokens_per_step / median, mfu, peak_tflops);
  fsdpp::destroy_process_group();
  return 0;
}

// The main job: trains a small GPT-style transformer with FSDP (each block a unit, then the
// root) on every rank of the launcher's group, logging the loss per step, and ends with each
// rank's peak tensor memory next to what an unsharded run holds. Rank 0 also trains the
// plain model on the global batch and the job fails if the losses part.
//   build/tools/fsdpp-run --nproc-per-node 4 build/examples/train_transformer
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "standalone.h"
#include "transformer.h"

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Bytes of parameters + gradients + Adam's two moments held by `params` (each tensor once).
int64_t training_state_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  std::vector<const c10::TensorImpl*> seen;
  for (const auto& p : params) {
    if (std::find(seen.begin(), seen.end(), p.unsafeGetTensorImpl()) != seen.end()) continue;
    seen.push_back(p.unsafeGetTensorImpl());
    bytes += 4 * p.numel() * p.element_size();
  }
  return bytes;
}

}  // namespace

int run() {
  using namespace fsdpp::examples;
  auto world = init_process_group_or_single_rank({}, "train_transformer");
  const int rank = world.rank(), n = world.size();
  TransformerArgs args;
  args.n_layers = 4;
  args.vocab_size = 512;
  args.max_seq_len = 16;
  args.dim = 128;
  args.n_heads = 4;
  const int64_t global_batch = 2 * n, seq = 16, steps = 20;

  // A learnable task: each token's target is a fixed function of it.
  auto batch = [&](int64_t step) {
    torch::manual_seed(100 + step);
    at::Tensor tokens = torch::randint(args.vocab_size, {global_batch, seq}, torch::kLong);
    return std::make_pair(tokens, (tokens * 7 + 3).remainder(args.vocab_size));
  };

  fsdpp::reset_peak_memory_stats();
  torch::manual_seed(0);  // the same initial model on every rank
  auto model = fsdpp::fully_shard(
      Transformer(args), fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>()));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(3e-3));
  const int64_t local = global_batch / n;
  std::vector<double> losses;
  for (int64_t step = 0; step < steps; ++step) {
    auto [tokens, targets] = batch(step);
    opt.zero_grad();
    at::Tensor loss = language_model_loss(model->forward(tokens.narrow(0, rank * local, local)),
                                          targets.narrow(0, rank * local, local));
    loss.backward();
    opt.step();
    at::Tensor global_loss = loss.detach().clone();
    fsdpp::all_reduce(global_loss, fsdpp::ReduceOp::AVG);
    losses.push_back(global_loss.item<double>());
    // Count the training steps' peak, not the model's construction (whole on every rank
    // until fully_shard shards it).
    if (step == 0) fsdpp::reset_peak_memory_stats();
    if (rank == 0) std::printf("step %2lld  loss %.6f\n", static_cast<long long>(step), losses.back());
  }
  const int64_t sharded_bytes = training_state_bytes(model->parameters());
  const int64_t fsdp_peak = fsdpp::memory_stats().peak_bytes;

  // Memory of the same model unsharded: one step on this rank's slice.
  fsdpp::reset_peak_memory_stats();
  const int64_t baseline = fsdpp::memory_stats().current_bytes;
  int64_t unsharded_bytes = 0;
  {
    torch::manual_seed(0);
    Transformer plain(args);
    torch::optim::Adam plain_opt(plain->parameters(), torch::optim::AdamOptions(3e-3));
    unsharded_bytes = training_state_bytes(plain->parameters());
    auto [tokens, targets] = batch(0);
    language_model_loss(plain->forward(tokens.narrow(0, rank * local, local)), targets.narrow(0, rank * local, local))
        .backward();
    plain_opt.step();
  }
  const int64_t plain_peak = fsdpp::memory_stats().peak_bytes - baseline;

  // Rank 0 replays the training unsharded on the global batch: the losses must agree.
  double worst = 0;
  if (rank == 0) {
    torch::manual_seed(0);
    Transformer plain(args);
    torch::optim::Adam plain_opt(plain->parameters(), torch::optim::AdamOptions(3e-3));
    for (int64_t step = 0; step < steps; ++step) {
      auto [tokens, targets] = batch(step);
      plain_opt.zero_grad();
      at::Tensor loss = language_model_loss(plain->forward(tokens), targets);
      loss.backward();
      plain_opt.step();
      worst = std::max(worst, std::abs(losses[step] - loss.item<double>()));
    }
  }

  std::fflush(stdout);
  fsdpp::barrier();
  std::printf(
      "rank %d: peak tensor memory of a training step %.3f MiB with FSDP vs %.3f MiB unsharded (%.2fx); params+grads+Adam %.3f MiB vs "
      "%.3f MiB (%.3f, 1/N = %.3f)\n",
      rank, mib(fsdp_peak), mib(plain_peak), static_cast<double>(fsdp_peak) / plain_peak, mib(sharded_bytes),
      mib(unsharded_bytes), static_cast<double>(sharded_bytes) / unsharded_bytes, 1.0 / n);
  std::fflush(stdout);
  fsdpp::barrier();
  if (rank == 0) {
    if (worst > 1e-4) {
      std::fprintf(stderr, "FAILED: FSDP losses differ from single-process training by up to %.3g\n", worst);
      return 1;
    }
    std::printf("OK: %lld steps; FSDP losses equal single-process training on the global batch within %.2g\n",
                static_cast<long long>(steps), worst);
  }
  fsdpp::destroy_process_group();
  return 0;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_transformer: %s\n", e.what());
    return 1;
  }
}

// Training a model whose training state does not fit one rank: under a per-rank memory limit of
// 3.5 x the float32 parameters' bytes (the plain model's parameters, gradients and Adam's two
// moments take 4 x), a transformer built deferred trains at N = 4 at parity with the plain model,
// its checkpoint resumes at N = 2 and 3 under the same limit, and DDP and the plain model under
// it stop with the out-of-memory error. The ranks compare their own rows with the reference: no
// full copy is made under the limit.
//
// The issue asked for float32 parameters of 3x the limit at N = 4 with Adam; that cannot fit: a
// rank then holds (P + G + 2 moments) / 4 = P, above the limit by itself. What fits at N ranks is
// P < limit x N / 4 (less the gathered units and activations).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <fsdpp/checkpoint.h>
#include <fsdpp/deferred_init.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/memory.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"
#include "transformer.h"

namespace fsdpp {
namespace {

using examples::Transformer;
using examples::TransformerArgs;
using examples::TransformerBlockImpl;
namespace ckpt = checkpoint;

constexpr int kSteps = 3;  // at N = 4; one more after each resume
constexpr double kLimitOverParams = 3.5;

TransformerArgs model_args() {
  TransformerArgs args;
  args.n_layers = 4;
  args.dim = 128;
  args.n_heads = 4;
  args.vocab_size = 256;
  args.max_seq_len = 16;
  return args;
}

MaterializeOptions init_options() { return MaterializeOptions().seed(5).param_init_fn(examples::init_transformer_module); }

Transformer deferred_model() { return deferred_init([] { return Transformer(model_args()); }); }

at::Tensor tokens_of_step(int step) {
  torch::manual_seed(100 + step);
  return torch::randint(256, {kGlobalBatch, 16});
}

at::Tensor loss_on(const std::function<at::Tensor(const at::Tensor&)>& forward, const at::Tensor& tokens) {
  return examples::language_model_loss(forward(tokens), tokens);
}

// The plain model's values after 3 and after 4 steps of Adam on the global batch.
struct Reference {
  std::map<std::string, at::Tensor> after_3, after_4;
  int64_t param_bytes = 0;
};

Reference reference() {
  Reference r;
  Transformer model = deferred_model();
  materialize_module(*model, init_options());
  torch::optim::Adam opt(model->parameters(), 1e-3);
  for (int step = 0; step <= kSteps; ++step) {
    if (step == kSteps)
      for (const auto& p : model->named_parameters()) r.after_3[p.key()] = p.value().detach().clone();
    opt.zero_grad();
    loss_on([&](const at::Tensor& t) { return model->forward(t); }, tokens_of_step(step)).backward();
    opt.step();
  }
  for (const auto& p : model->named_parameters()) {
    r.after_4[p.key()] = p.value().detach().clone();
    r.param_bytes += p.value().numel() * 4;
  }
  return r;
}

FullyShardedDataParallel<examples::TransformerImpl> sharded(Transformer model) {
  return fully_shard(model, FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<TransformerBlockImpl>()));
}

void train_step(const std::function<at::Tensor(const at::Tensor&)>& forward, torch::optim::Optimizer& opt, int step,
                const RankContext& ctx) {
  const int64_t local = kGlobalBatch / ctx.world_size;
  opt.zero_grad();
  loss_on(forward, tokens_of_step(step).narrow(0, ctx.rank * local, local)).backward();
  opt.step();
}

// Each rank's rows of every parameter against the reference's.
void expect_rows(torch::nn::Module& root, const std::map<std::string, at::Tensor>& expected, const std::string& when) {
  int compared = 0;
  for (FSDPModule* unit : fsdp_units(root)) {
    for (const ShardedParameter& p : unit->sharded_parameters()) {
      std::string key;
      for (const auto& named : root.named_parameters())
        if (named.value().is_same(p.param)) key = strip_wrapper_prefixes(named.key());
      ASSERT_FALSE(key.empty()) << p.name;
      // Adam divides by the root of the squared gradients' average, so a rounding difference in
      // a gradient near zero (the 4 ranks reduce in another order than one process) moves an
      // element by up to its step size: 1.2e-5 measured on libtorch 2.6 after 3 steps at lr 1e-3.
      // A wrong row or batch slice moves it by ~lr per step.
      const at::Tensor got = p.local_shard, want = p.layout.local_of_full(expected.at(key));
      EXPECT_TRUE(at::allclose(got, want, /*rtol=*/1e-4, /*atol=*/1e-4))
          << when << " " << key << ": max abs diff " << (got - want).abs().max().item<double>();
      ++compared;
    }
  }
  EXPECT_EQ(compared, static_cast<int>(expected.size())) << when;
}

int64_t vm_hwm_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

// Sets the limit above what this process holds now; removed when the scope ends.
struct LimitScope {
  explicit LimitScope(int64_t bytes) : base(memory_stats().current_bytes) {
    empty_cache();
    set_memory_limit(base + bytes);
    reset_peak_memory_stats();
  }
  ~LimitScope() { set_memory_limit(0); }
  int64_t peak() const { return memory_stats().peak_bytes - base; }
  int64_t base;
};

void report(const RankContext& ctx, const char* what, int64_t peak, const Reference& ref, int64_t limit) {
  std::printf("%s, rank %d of %d: peak tensor memory %.2f MiB (%.2fx the parameters' %.2f MiB; limit %.2f MiB, "
              "training state of the whole model %.2f MiB); VmHWM %.0f MiB\n",
              what, ctx.rank, ctx.world_size, peak / 1048576.0, static_cast<double>(peak) / ref.param_bytes,
              ref.param_bytes / 1048576.0, limit / 1048576.0, 4.0 * ref.param_bytes / 1048576.0, vm_hwm_kib() / 1024.0);
}

TEST(TrainUnderMemoryLimit, FourRanksTrainTwoAndThreeResumeDdpAndPlainFail) {
  char dir_template[] = "/tmp/fsdpp_limit_XXXXXX";
  const std::string dir = std::string(mkdtemp(dir_template)) + "/ckpt";
  testing::RunOptions options;
  options.deadline = std::chrono::seconds(240);

  run_ranks(4, [&](RankContext& ctx) {
    const Reference ref = reference();
    const auto limit = static_cast<int64_t>(kLimitOverParams * static_cast<double>(ref.param_bytes));
    LimitScope scope(limit);
    auto model = sharded(deferred_model());
    materialize_module(*model, init_options());
    torch::optim::Adam opt(model->parameters(), 1e-3);
    for (int step = 0; step < kSteps; ++step)
      train_step([&](const at::Tensor& t) { return model->forward(t); }, opt, step, ctx);
    expect_rows(*model, ref.after_3, "4 ranks after 3 steps");
    ckpt::State state = ckpt::to_state(get_model_state_dict(model), "model.");
    state.merge(ckpt::to_state(get_optimizer_state_dict(model, opt), "optim."));
    ckpt::save(state, dir);
    report(ctx, "FSDP N = 4, deferred, Adam", scope.peak(), ref, limit);
  }, options);

  for (int n : {2, 3})
    run_ranks(n, [&](RankContext& ctx) {
      const Reference ref = reference();
      const auto limit = static_cast<int64_t>(kLimitOverParams * static_cast<double>(ref.param_bytes));
      LimitScope scope(limit);
      auto model = sharded(deferred_model());
      to_empty(*model);
      torch::optim::Adam opt(model->parameters(), 1e-3);
      // In place: the load's read buffers would otherwise hold a second copy of this rank's
      // state (measured: over the limit at N = 2); nothing is lost if it fails after to_empty.
      load_checkpoint(*model, opt, dir, {}, ckpt::LoadOptions().in_place(true));
      expect_rows(*model, ref.after_3, "resumed at " + std::to_string(n));
      train_step([&](const at::Tensor& t) { return model->forward(t); }, opt, kSteps, ctx);
      expect_rows(*model, ref.after_4, "resumed at " + std::to_string(n) + ", one step on");
      report(ctx, n == 2 ? "FSDP N = 2, resumed" : "FSDP N = 3, resumed", scope.peak(), ref, limit);
    }, options);

  // DDP holds the whole model, its gradients and Adam's moments on every rank; the plain model
  // in one process too: both stop with the out-of-memory error, not a crash or a hang.
  for (int n : {2, 1})
    run_ranks(n, [&](RankContext& ctx) {
      const Reference ref = reference();
      const auto limit = static_cast<int64_t>(kLimitOverParams * static_cast<double>(ref.param_bytes));
      std::string what = "no error";
      {
        LimitScope scope(limit);
        try {
          Transformer model = deferred_model();
          materialize_module(*model, init_options());
          torch::optim::Adam opt(model->parameters(), 1e-3);
          if (n == 1) {
            for (int step = 0; step <= kSteps; ++step)
              train_step([&](const at::Tensor& t) { return model->forward(t); }, opt, step, ctx);
          } else {
            DistributedDataParallel<examples::TransformerImpl> ddp(model);
            for (int step = 0; step <= kSteps; ++step)
              train_step([&](const at::Tensor& t) { return ddp.forward(t); }, opt, step, ctx);
          }
        } catch (const c10::OutOfMemoryError& e) {
          what = e.what_without_backtrace();
        }
      }
      EXPECT_NE(what.find("out of memory under fsdpp's memory limit"), std::string::npos) << what;
      if (ctx.rank == 0) std::printf("%s under the same limit: %s\n", n == 1 ? "plain model" : "DDP N = 2", what.c_str());
    }, options);
  std::filesystem::remove_all(std::filesystem::path(dir).parent_path());
}

}  // namespace
}  // namespace fsdpp

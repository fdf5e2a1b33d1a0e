// fsdpp-plan: per-rank memory and bytes on the wire of one FSDP training step, from a
// transformer's shape and a parallel layout, without running it (include/fsdpp/plan.h,
// docs/plan.md). Its defaults are bench_fsdp's transformer, so
//   fsdpp-plan -n 4                      predicts   fsdpp-run --nproc-per-node 4 bench_fsdp
//   fsdpp-plan --preset llama3-70b --seq 8192 --local-batch 1 --param-dtype bf16 --ac
//       --sweep 8,64,512,4096,8192 --fit-gib 80   (one command)
//   fsdpp-plan --hf-config Meta-Llama-3.1-8B/config.json -n 64 --param-dtype bf16   (a Hugging Face model's shape)
// Its backward prefetch defaults to `bounded`, fully_shard's BACKWARD_PRE_WITHIN_BOUND.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <fsdpp/error.h>
#include <fsdpp/llama.h>
#include <fsdpp/plan.h>

namespace {

using fsdpp::plan::ModelShape;
using fsdpp::plan::ParallelLayout;

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1LL << 30); }

// A peak over the comm thread's two orders (plan.h): "low-high" GiB where they differ.
std::string gib_range(int64_t low, int64_t high) {
  char text[64];
  if (low == high)
    std::snprintf(text, sizeof text, "%.2f", gib(low));
  else
    std::snprintf(text, sizeof text, "%.2f-%.2f", gib(low), gib(high));
  return text;
}

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// One row per world size: the lines of format_plan in GiB, and the fitted depth.
void print_sweep(const ModelShape& model, ParallelLayout layout, const std::vector<int64_t>& sizes, double fit_gib) {
  std::printf("| ranks | params | grads | Adam | activations | largest unit | comm buffers | fwd peak | bwd peak | "
              "step peak | all-gather | reduce-scatter | replicate all-reduce |%s\n",
              fit_gib > 0 ? " largest fitting model |" : "");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", fit_gib > 0 ? "---|" : "");
  for (int64_t n : sizes) {
    layout.world_size(n);
    const auto p = fsdpp::plan::plan_step(model, layout);
    const int64_t step_low = p.held + std::max(p.forward_peak_low, p.backward_peak_low);
    std::printf("| %lld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %.2f | %.2f | %.2f |",
                static_cast<long long>(n), gib(p.parameters), gib(p.gradients), gib(p.optimizer_state),
                gib(p.activations), gib(p.largest_unit), gib(p.comm_buffers),
                gib_range(p.forward_peak_low, p.forward_peak_high).c_str(),
                gib_range(p.backward_peak_low, p.backward_peak_high).c_str(),
                gib_range(step_low, p.step_peak_high).c_str(), gib(p.all_gather_bytes), gib(p.reduce_scatter_bytes),
                gib(p.replicate_all_reduce_bytes));
    if (fit_gib > 0) {
      const int64_t layers =
          fsdpp::plan::largest_fitting_layers(model, layout, static_cast<int64_t>(fit_gib * (1LL << 30)));
      ModelShape fitted = model;
      fitted.layers(layers);
      std::printf(" %lld layers, %.1f B |", static_cast<long long>(layers),
                  static_cast<double>(fsdpp::plan::total_parameters(fitted)) / 1e9);
    }
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp-plan: per-rank memory and bytes on the wire of an FSDP step, without running it"};
  ModelShape model;
  ParallelLayout layout;
  std::string hf_config, preset, arch = "example", attention, param_dtype = "fp32", reduce_dtype, optimizer = "adam",
                      prefetch = "bounded", sweep;
  int64_t layers = 0, dim = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0, batch = 0;
  int64_t world = 1, replicate = 1, tp = 1;
  bool no_reshard = false, ac = false, offload = false, tied = false, trace = false;
  double fit_gib = 0;
  app.add_option("--preset", preset, "llama3-8b or llama3-70b (shape only; flags below override)")
      ->check(CLI::IsMember({"llama3-8b", "llama3-70b"}));
  app.add_option("--hf-config", hf_config,
                 "a Hugging Face Llama config.json (shape only, sequences of min(8192, max_position_embeddings); flags below override)")
      ->excludes("--preset");
  app.add_option("--arch", arch, "example (examples/transformer.h) or llama")->check(CLI::IsMember({"example", "llama"}));
  app.add_option("--layers", layers);
  app.add_option("--dim", dim);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--ffn", ffn, "MLP hidden size (default 4 x dim)");
  app.add_option("--vocab", vocab);
  app.add_option("--seq", seq);
  app.add_option("--local-batch", batch, "sequences per data-parallel rank");
  app.add_flag("--tied", tied, "output projection tied to the token embedding");
  app.add_option("--attention", attention, "explicit or fused (default: explicit for example, fused for llama)")
      ->check(CLI::IsMember({"explicit", "fused"}));
  app.add_option("-n,--world-size", world, "ranks");
  app.add_option("--replicate", replicate, "HSDP replicas (shard group = world / (replicate x tp))");
  app.add_option("--tp", tp, "tensor-parallel degree");
  app.add_flag("--no-reshard-after-forward", no_reshard);
  app.add_option("--param-dtype", param_dtype)->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--reduce-dtype", reduce_dtype, "default: the param dtype")->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--ac", ac, "activation checkpointing of every block");
  app.add_flag("--offload", offload, "CPU offload of sharded parameters, gradients and optimizer state");
  app.add_option("--optimizer", optimizer)->check(CLI::IsMember({"adam", "sgd", "sgd-momentum"}));
  app.add_option("--backward-prefetch", prefetch, "pre, none or bounded (fully_shard's default, BACKWARD_PRE_WITHIN_BOUND)")->check(CLI::IsMember({"pre", "none", "bounded"}));
  app.add_option("--sweep", sweep, "comma-separated world sizes: one table row each");
  app.add_option("--fit-gib", fit_gib, "with --sweep: the most layers whose step peak fits in this many GiB per rank");
  app.add_flag("--trace", trace, "print live bytes after each op and FSDP event of the replayed step");
  CLI11_PARSE(app, argc, argv);

  try {
    if (preset == "llama3-8b") model = ModelShape::llama(32, 4096, 32, 8, 14336, 128256).seq(8192).batch(1);
    if (preset == "llama3-70b") model = ModelShape::llama(80, 8192, 64, 8, 28672, 128256).seq(8192).batch(1);
    if (!hf_config.empty()) {
      const fsdpp::LlamaConfig c = fsdpp::LlamaConfig::from_file(hf_config);
      if (c.attention_head_dim() * c.num_attention_heads != c.hidden_size)
        throw fsdpp::Error(hf_config + ": head_dim " + std::to_string(c.attention_head_dim()) + " x " +
                           std::to_string(c.num_attention_heads) + " heads is not hidden_size " + std::to_string(c.hidden_size) +
                           "; the planner's Llama shape has head_dim = hidden_size / num_attention_heads");
      model = ModelShape::llama(c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                                c.intermediate_size, c.vocab_size)
                  .tied_embeddings(c.tie_word_embeddings)
                  .seq(std::min<int64_t>(8192, c.max_position_embeddings))
                  .batch(1);
    }
    if (preset.empty() && hf_config.empty() && arch == "llama") model.architecture(fsdpp::plan::Architecture::kLlama).attention(fsdpp::plan::AttentionKernel::kFused);
    if (layers) model.layers(layers);
    if (dim) model.dim(dim);
    if (heads) model.heads(heads);
    if (kv_heads) model.kv_heads(kv_heads);
    if (ffn) model.ffn_hidden(ffn);
    if (vocab) model.vocab(vocab);
    if (seq) model.seq(seq);
    if (batch) model.batch(batch);
    if (tied) model.tied_embeddings(true);
    if (!attention.empty())
      model.attention(attention == "fused" ? fsdpp::plan::AttentionKernel::kFused : fsdpp::plan::AttentionKernel::kExplicit);
    const std::map<std::string, c10::ScalarType> dtypes{
        {"fp32", c10::ScalarType::Float}, {"bf16", c10::ScalarType::BFloat16}, {"fp16", c10::ScalarType::Half}};
    const std::map<std::string, fsdpp::plan::Optimizer> optimizers{{"adam", fsdpp::plan::Optimizer::kAdam},
                                                                   {"sgd", fsdpp::plan::Optimizer::kSGD},
                                                                   {"sgd-momentum", fsdpp::plan::Optimizer::kSGDMomentum}};
    const std::map<std::string, fsdpp::plan::BackwardPrefetch> prefetches{
        {"pre", fsdpp::plan::BackwardPrefetch::kBackwardPre},
        {"none", fsdpp::plan::BackwardPrefetch::kNone},
        {"bounded", fsdpp::plan::BackwardPrefetch::kBounded}};
    layout.world_size(world)
        .replicate(replicate)
        .tensor_parallel(tp)
        .reshard_after_forward(!no_reshard)
        .param_dtype(dtypes.at(param_dtype))
        .reduce_dtype(dtypes.at(reduce_dtype.empty() ? param_dtype : reduce_dtype))
        .activation_checkpointing(ac)
        .cpu_offload(offload)
        .optimizer(optimizers.at(optimizer))
        .backward_prefetch(prefetches.at(prefetch));
    if (!sweep.empty()) {
      print_sweep(model, layout, parse_sizes(sweep), fit_gib);
      return 0;
    }
    if (trace) std::fputs(fsdpp::plan::trace_step(model, layout).c_str(), stdout);
    std::fputs(fsdpp::plan::format_plan(model, layout, fsdpp::plan::plan_step(model, layout)).c_str(), stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

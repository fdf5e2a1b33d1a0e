// bench_fsdp's transformer on three layouts at N = 4, measured in one run under fsdpp-run:
//  - 1-D FSDP over the world: every block a unit, then the root (bench_fsdp's layout);
//  - HSDP on a 2 x 2 mesh ("replicate", "shard"): the same units, sharded over 2 ranks and
//    replicated across 2;
//  - FSDP x TP on a 2 x 2 mesh ("dp", "tp"): examples/tp_transformer.h parallelized by
//    tp_transformer_plan over "tp", then every block and the root fully_shard over "dp".
// All three train on the same global batch of 4 * local-batch sequences: a rank of 1-D FSDP or
// HSDP takes local-batch rows of it, a dp rank of FSDP x TP takes 2 * local-batch rows (the
// same rows on both of its tp ranks).
// For each layout: bytes sent per step per rank by collective kind (CommDebugMode) against the
// bound derived from the units' padded sizes and the TP styles (below), the peak tensor memory
// of a step above what is held between steps, the parameters + gradients + Adam state held per
// rank, and the median step time, in rounds that alternate the layouts.
//   fsdpp-run --nproc-per-node 4 bench_fsdp_mesh --layers 4 --dim 256
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "bench_util.h"
#include "step_timer.h"
#include "tp_transformer.h"
#include "transformer.h"

namespace {

using fsdpp::bench::add_transformer_options;
using fsdpp::bench::median_step;
using fsdpp::bench::mib;
using fsdpp::bench::state_bytes;
using fsdpp::bench::TransformerBenchArgs;
using fsdpp::examples::language_model_loss;
using fsdpp::examples::TPTransformer;
using fsdpp::examples::TPTransformerBlockImpl;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerBlockImpl;

// Bytes one rank sends in one training step, by collective kind.
struct Bytes {
  double all_gather = 0, reduce_scatter = 0, all_reduce = 0;
  double total() const { return all_gather + reduce_scatter + all_reduce; }
  Bytes& operator+=(const Bytes& o) {
    all_gather += o.all_gather;
    reduce_scatter += o.reduce_scatter;
    all_reduce += o.all_reduce;
    return *this;
  }
};

// What a ring all-reduce of `bytes` over `size` ranks sends per rank: 2 (size-1)/size of it.
// CommDebugMode counts Gloo's ring segments (src/comm/wire_bytes.cpp); over 2 ranks they are
// exact: the reduce-scatter phase sends one half of the buffer, the all-gather phase the other.
double ring_all_reduce(double bytes, int size) { return 2.0 * (size - 1) / size * bytes; }

// FSDP's collectives, per unit of Psi_u padded parameter bytes over a shard group of S ranks:
// the all-gather (S-1)/S * Psi_u in forward and again in backward for a unit that reshards after
// forward (all but the root), the gradient reduce-scatter (S-1)/S * Psi_u and, with R replicas
// (HSDP), a ring all-reduce of the gradient shard Psi_u / S across them.
Bytes fsdp_bound(torch::nn::Module& model, int shard, int replicate, double* largest_unit) {
  Bytes b;
  for (const auto& m : model.modules())
    if (auto* unit = dynamic_cast<fsdpp::FSDPModule*>(m.get())) {
      const double psi = unit->unsharded_padded_numel() * 4.0;
      *largest_unit = std::max(*largest_unit, psi);
      const bool reshards = !unit->is_root() && unit->reshard_after_forward().reshards();
      b.all_gather += (reshards ? 2.0 : 1.0) * (shard - 1) / shard * psi;
      b.reduce_scatter += double(shard - 1) / shard * psi;
      b.all_reduce += ring_all_reduce(psi / shard, replicate);
    }
  return b;
}

// TP's collectives over its group of T ranks, from the style each parallelized module runs
// with (src/tensor_parallel/tensor_parallel_module.cpp), for an activation of `rows` tokens
// (batch x seq) of float32:
//  - ColwiseParallel Linear: backward all-reduces its input's gradient (rows x in): every
//    Linear's input here requires grad; with output_layouts(Replicate) forward all-gathers the
//    output, padded to rows x ceil(out/T) per rank: (T-1) of that sent;
//  - ColwiseParallel Embedding: with output_layouts(Replicate), the same all-gather of rows x
//    ceil(dim/T) (its input, the ids, has no gradient);
//  - RowwiseParallel (Linear or Embedding): forward all-reduces its output (rows x out, or
//    rows x dim); a Linear with input_layouts(Replicate) all-gathers its input's gradient in
//    backward, rows x ceil(in/T) per rank.
Bytes tp_bound(torch::nn::Module& model, int64_t rows, int* all_reduces) {
  Bytes b;
  for (const auto& m : model.modules()) {
    auto* tp = dynamic_cast<fsdpp::TensorParallelModule*>(m.get());
    if (!tp || !tp->is_parallelized()) continue;
    // Sequence parallelism (SequenceParallel, PrepareModuleInput, Shard(d) activations) moves
    // other collectives: counting them is not done here, so it is refused rather than miscounted.
    const auto* col_style = std::get_if<fsdpp::ColwiseParallel>(&*tp->style());
    const auto* row_style = std::get_if<fsdpp::RowwiseParallel>(&*tp->style());
    if (!(col_style && col_style->input_layouts_.is_replicate()) &&
        !(row_style && row_style->output_layouts_.is_replicate()))
      throw std::runtime_error("tp_bound: " + fsdpp::to_string(*tp->style()) +
                               " is not counted (the bound covers the plan without sequence parallelism)");
    const int t = tp->process_group().size();
    auto ceil_part = [t](int64_t extent) { return (extent + t - 1) / t; };
    auto add_all_reduce = [&](int64_t features) {
      b.all_reduce += ring_all_reduce(4.0 * rows * features, t);
      ++*all_reduces;
    };
    auto add_all_gather = [&](int64_t features) { b.all_gather += 4.0 * (t - 1) * rows * ceil_part(features); };
    const auto* linear = dynamic_cast<torch::nn::LinearImpl*>(tp->wrapped_module().get());
    const auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(tp->wrapped_module().get());
    const int64_t in = linear ? linear->options.in_features() : 0;
    const int64_t out = linear ? linear->options.out_features() : embedding->options.embedding_dim();
    if (const auto* col = std::get_if<fsdpp::ColwiseParallel>(&*tp->style())) {
      if (linear) add_all_reduce(in);
      if (col->output_layouts_ == fsdpp::TPLayout::Replicate) add_all_gather(out);
    } else {
      const auto& row = std::get<fsdpp::RowwiseParallel>(*tp->style());
      add_all_reduce(out);
      if (linear && row.input_layouts_ == fsdpp::TPLayout::Replicate) add_all_gather(in);
    }
  }
  return b;
}

struct Layout {
  std::string name;
  std::shared_ptr<torch::nn::Module> model;
  std::function<at::Tensor()> forward;  // this rank's logits
  at::Tensor targets;
  std::unique_ptr<torch::optim::Adam> opt;
  int shard = 1, replicate = 1;  // FSDP's shard group and (HSDP) replicate group sizes
  Bytes bound, measured;
  int tp_all_reduces = 0;
  int64_t other_collectives = 0;  // any collective kind the bound does not count
  double largest_unit = 0, held = 0, transient_peak = 0, first_loss = 0;
  std::vector<double> times;

  void step() {
    opt->zero_grad();
    language_model_loss(forward(), targets).backward();
    opt->step();
  }
};

double ratio(double measured, double bound) { return bound == 0 ? (measured == 0 ? 1.0 : 0.0) : measured / bound; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp 1-D FSDP, HSDP 2 x 2 and FSDP x TP 2 x 2 on a transformer: wire bytes vs bound, memory, step time"};
  TransformerBenchArgs args;
  args.model.n_layers = 2;
  args.model.dim = 128;
  add_transformer_options(app, args);
  app.get_option("--local-batch")
      ->description("sequences per rank of 1-D FSDP and HSDP (a dp rank of FSDP x TP: twice)");
  app.add_option("--vocab", args.model.vocab_size);
  app.add_option("--heads", args.model.n_heads, "attention heads (the tp ranks split them)");
  app.add_option("--rounds", args.rounds, "timed rounds, each timing the three layouts in turn");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int rank = world.rank(), n = world.size();
  if (n != 4) {
    if (rank == 0) std::fprintf(stderr, "bench_fsdp_mesh: needs 4 ranks (2 x 2 meshes), got %d\n", n);
    fsdpp::destroy_process_group();
    return 2;
  }
  if (args.model.n_heads % 2 != 0 || args.model.dim % args.model.n_heads != 0) {
    if (rank == 0) std::fprintf(stderr, "bench_fsdp_mesh: --heads must be even (2 tp ranks) and divide --dim\n");
    fsdpp::destroy_process_group();
    return 2;
  }
  const int64_t seq = args.model.max_seq_len;
  // The global batch, the same on every rank; each layout takes its rows of it.
  torch::manual_seed(1234);
  const at::Tensor all_tokens = torch::randint(args.model.vocab_size, {n * args.local_batch, seq}, torch::kLong);
  const at::Tensor all_targets = torch::randint(args.model.vocab_size, {n * args.local_batch, seq}, torch::kLong);
  auto rows_of = [&](const at::Tensor& t, int part, int64_t rows) { return t.narrow(0, part * rows, rows).clone(); };

  const auto blocks = fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>());
  std::vector<Layout> layouts(3);
  // 1-D FSDP and HSDP: the plain transformer, every block a unit, this rank's rows of the batch.
  auto fsdp_layout = [&](Layout& l, std::string name, const fsdpp::FullyShardOptions& options, int replicate, int shard) {
    l.name = std::move(name);
    l.replicate = replicate;
    l.shard = shard;
    torch::manual_seed(0);
    auto model = fsdpp::fully_shard(Transformer(args.model), options);
    const at::Tensor tokens = rows_of(all_tokens, rank, args.local_batch);
    l.targets = rows_of(all_targets, rank, args.local_batch);
    l.model = model.ptr();
    l.forward = [model, tokens]() mutable { return model->forward(tokens); };
  };
  fsdp_layout(layouts[0], "1-D FSDP (4)", blocks, 1, n);
  const auto hsdp_mesh = fsdpp::init_device_mesh(world, {2, 2}, {"replicate", "shard"});
  fsdp_layout(layouts[1], "HSDP 2 x 2", fsdpp::FullyShardOptions(blocks).mesh(hsdp_mesh), hsdp_mesh.size(0),
              hsdp_mesh.size(1));
  {
    Layout& l = layouts[2];
    l.name = "FSDP x TP 2 x 2";
    auto mesh = fsdpp::init_device_mesh(world, {2, 2}, {"dp", "tp"});
    l.shard = mesh.size(0);
    torch::manual_seed(0);
    TPTransformer tp_model(args.model);
    fsdpp::parallelize_module(*tp_model, mesh["tp"], fsdpp::examples::tp_transformer_plan(args.model.n_layers));
    auto model = fsdpp::fully_shard(
        tp_model, fsdpp::FullyShardOptions().mesh(mesh["dp"]).auto_wrap_policy(
                      fsdpp::ModuleWrapPolicy<TPTransformerBlockImpl>()));
    const int64_t dp_batch = n * args.local_batch / mesh.size(0);
    const int dp_rank = mesh.get_local_rank("dp");
    const at::Tensor tokens = rows_of(all_tokens, dp_rank, dp_batch);
    l.targets = rows_of(all_targets, dp_rank, dp_batch);
    l.model = model.ptr();
    l.forward = [model, tokens]() mutable { return model->forward(tokens); };
  }

  torch::manual_seed(0);
  const double plain_state = state_bytes(Transformer(args.model)->parameters());
  for (Layout& l : layouts) {
    l.opt = std::make_unique<torch::optim::Adam>(l.model->parameters(), torch::optim::AdamOptions(1e-4));
    // The first step's loss, averaged over the world: the global batch's loss in every layout
    // (equal local batches; tp ranks hold the same loss), so the layouts should agree.
    l.opt->zero_grad();
    at::Tensor loss = language_model_loss(l.forward(), l.targets);
    loss.backward();
    l.opt->step();  // Adam state exists from here on
    at::Tensor mean = loss.detach().to(at::kDouble).reshape({1}) / n;
    fsdpp::all_reduce(mean, fsdpp::ReduceOp::SUM, world);
    l.first_loss = mean.item<double>();
    // After the first forward, which found the root (its all-gather is counted once).
    l.bound = tp_bound(*l.model, l.targets.numel(), &l.tp_all_reduces);
    l.bound += fsdp_bound(*l.model, l.shard, l.replicate, &l.largest_unit);
    fsdpp::barrier(world);
    // One step: its wire bytes and its peak above the tensors alive between steps.
    fsdpp::reset_peak_memory_stats();
    const int64_t base = fsdpp::memory_stats().current_bytes;
    {
      fsdpp::CommDebugMode comm;
      l.step();
      l.measured.all_gather = comm.bytes_sent("all_gather_into_tensor");
      l.measured.reduce_scatter = comm.bytes_sent("reduce_scatter_tensor");
      l.measured.all_reduce = comm.bytes_sent("all_reduce");
      l.other_collectives = comm.get_total_counts() - comm.count("all_gather_into_tensor") -
                            comm.count("reduce_scatter_tensor") - comm.count("all_reduce");
    }
    l.transient_peak = fsdpp::memory_stats().peak_bytes - base;
    l.held = state_bytes(l.model->parameters());
  }
  // Every rank's bytes against its own bound: the largest difference over ranks, per layout.
  std::vector<double> gap_values;
  for (const Layout& l : layouts) {
    const Bytes &m = l.measured, &b = l.bound;
    gap_values.push_back(std::abs(m.all_gather - b.all_gather) + std::abs(m.reduce_scatter - b.reduce_scatter) +
                         std::abs(m.all_reduce - b.all_reduce));
  }
  at::Tensor gaps = at::tensor(gap_values, at::kDouble);
  fsdpp::all_reduce(gaps, fsdpp::ReduceOp::MAX, world);
  const auto* gap = gaps.data_ptr<double>();
  for (int round = 0; round < args.rounds; ++round)
    for (Layout& l : layouts) l.times.push_back(median_step([&l] { l.step(); }, args.warmup, args.steps, &world));

  if (rank == 0) {
    std::printf("%s\n", fsdpp::bench::blas_description().c_str());
    std::printf("transformer: %lld layers, dim %lld, %lld heads, vocab %lld, seq %lld, %.3f MiB of parameters; N = %d; "
                "global batch %lld (1-D, HSDP: %lld per rank; FSDP x TP: %lld per dp rank)\n",
                static_cast<long long>(args.model.n_layers), static_cast<long long>(args.model.dim),
                static_cast<long long>(args.model.n_heads), static_cast<long long>(args.model.vocab_size),
                static_cast<long long>(seq), mib(plain_state / 4), n, static_cast<long long>(n * args.local_batch),
                static_cast<long long>(args.local_batch), static_cast<long long>(n * args.local_batch / 2));
    std::printf("wire bytes per step, rank 0 (MiB, measured / bound):\n");
    for (const Layout& l : layouts) {
      const Bytes &m = l.measured, &b = l.bound;
      std::printf("  %-16s all-gather %.4f / %.4f (%.4f), reduce-scatter %.4f / %.4f (%.4f), all-reduce %.4f / %.4f (%.4f); "
                  "total %.4f / %.4f (%.4f)\n",
                  l.name.c_str(), mib(m.all_gather), mib(b.all_gather), ratio(m.all_gather, b.all_gather),
                  mib(m.reduce_scatter), mib(b.reduce_scatter), ratio(m.reduce_scatter, b.reduce_scatter),
                  mib(m.all_reduce), mib(b.all_reduce), ratio(m.all_reduce, b.all_reduce), mib(m.total()),
                  mib(b.total()), ratio(m.total(), b.total()));
    }
    std::printf("  largest sum over kinds of |measured - bound| on any rank (bytes):");
    for (size_t i = 0; i < layouts.size(); ++i) std::printf(" %s %.0f;", layouts[i].name.c_str(), gap[i]);
    std::printf("\n");
    std::printf("  (FSDP x TP's bound includes %d TP activation all-reduces; other collectives in a step:",
                layouts[2].tp_all_reduces);
    for (const Layout& l : layouts) std::printf(" %lld", static_cast<long long>(l.other_collectives));
    std::printf(")\n");
    std::printf("first step's loss (world mean): ");
    for (const Layout& l : layouts) std::printf("%s %.6f  ", l.name.c_str(), l.first_loss);
    std::printf("\nmemory per rank (MiB): params+grads+Adam held; step peak above held; largest unit (padded)\n");
    for (const Layout& l : layouts)
      std::printf("  %-16s held %.3f (%.3f of unsharded %.3f), peak above held %.3f (%.3fx 1-D), largest unit %.3f\n",
                  l.name.c_str(), mib(l.held), l.held / plain_state, mib(plain_state), mib(l.transient_peak),
                  l.transient_peak / layouts[0].transient_peak, mib(l.largest_unit));
    std::printf("step time, median of %d steps per round (ms; ratio to 1-D FSDP in the same round):\n", args.steps);
    for (const Layout& l : layouts) {
      std::printf("  %-16s", l.name.c_str());
      for (size_t i = 0; i < l.times.size(); ++i)
        std::printf(" %.2f (%.3fx)", l.times[i] * 1e3, l.times[i] / layouts[0].times[i]);
      std::printf("\n");
    }
  }
  fsdpp::destroy_process_group();
  return 0;
}

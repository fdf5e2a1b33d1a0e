#pragma once
// What the FSDP benchmarks share besides step times (step_timer.h): the transformer and loop of
// bench_fsdp, bench_fsdp_options, bench_fsdp_mesh and bench_step_cpu with their common
// command-line options, sizes in MiB, the bytes a training state takes, and which BLAS libtorch
// multiplies with.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include "transformer.h"

namespace fsdpp::bench {

// The transformer (4 layers, dim 256, vocab 1024, sequences of 32, 4 heads; bench_fsdp_mesh's:
// 2 layers, dim 128), the sequences per rank and the timed loop (median_step's warmup and steps;
// rounds where variants alternate).
struct TransformerBenchArgs {
  examples::TransformerArgs model = [] {
    examples::TransformerArgs a;
    a.n_layers = 4;
    a.dim = 256;
    a.vocab_size = 1024;
    a.max_seq_len = 32;
    a.n_heads = 4;
    return a;
  }();
  int64_t local_batch = 2;
  int steps = 10, warmup = 3, rounds = 3;
};

// The options all four take: --layers, --dim, --local-batch, --steps. Each adds the ones only
// some take (--vocab, --heads, --rounds) itself.
inline void add_transformer_options(CLI::App& app, TransformerBenchArgs& args) {
  app.add_option("--layers", args.model.n_layers);
  app.add_option("--dim", args.model.dim);
  app.add_option("--local-batch", args.local_batch);
  app.add_option("--steps", args.steps);
}

inline double mib(double bytes) { return bytes / (1 << 20); }

// Bytes of the parameters, their gradients and Adam's exp_avg and exp_avg_sq (each tensor once).
inline int64_t state_bytes(const std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& p : params)
    if (seen.insert(p.unsafeGetTensorImpl()).second) bytes += 4 * p.numel() * p.element_size();
  return bytes;
}

// The BLAS this process loaded (libtorch's libblas.so.3, resolved: Debian's alternatives pick
// OpenBLAS or the reference BLAS, ~15x slower here) and OPENBLAS_NUM_THREADS, as
// scripts/describe-platform.sh names them.
inline std::string blas_description() {
  std::ifstream maps("/proc/self/maps");
  std::string line, path;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string file = line.substr(slash);
    if (file.find("libblas.so") != std::string::npos) {
      path = file;
      break;
    }
  }
  std::string out = path.empty()                                 ? std::string("no libblas.so loaded")
                    : path.find("openblas") != std::string::npos ? "OpenBLAS (" + path + ")"
                                                                 : "reference BLAS (" + path + ")";
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  return out + ", OPENBLAS_NUM_THREADS=" + (threads ? threads : "unset");
}

}  // namespace fsdpp::bench

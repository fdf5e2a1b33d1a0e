// Bandwidth of all_gather_into_tensor, reduce_scatter_tensor and all_reduce, reported as
// nccl-tests does (algorithm and bus bandwidth), with the bytes each rank put on the wire:
// as CommDebugMode counts them and as the kernel counted them (/proc/self/io wchar).
// With --gloo-native it also times libtorch's own Gloo single-tensor all-gather and
// reduce-scatter (`all_gather_single` / `reduce_scatter_single`), whose bytes only the kernel
// column sees.
// Run under the launcher: fsdpp-run --nproc-per-node 4 bench_collectives
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fsdpp/fsdpp.h>

#include "compat/c10d_tensor_collectives.h"

namespace {

// Bytes this process handed to write-like syscalls, sockets included.
int64_t kernel_bytes_written() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value)
    if (key == "wchar:") return value;
  return -1;
}

struct Result {
  double seconds = 0;       // per call, slowest rank
  int64_t counted = 0;      // CommDebugMode bytes per call, this rank
  int64_t kernel = 0;       // wchar delta per call, this rank
};

template <typename F>
Result measure(F&& call, int iterations) {
  call();  // warm-up: connections, allocations
  call();
  fsdpp::barrier();
  fsdpp::CommDebugMode mode;
  const int64_t written = kernel_bytes_written();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Result r;
  r.kernel = (kernel_bytes_written() - written) / iterations;
  r.counted = mode.total_bytes_sent() / iterations;
  at::Tensor t = at::tensor({elapsed / iterations}, at::kDouble);
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX);
  r.seconds = t.item<double>();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp collectives benchmark"};
  int64_t min_bytes = 4 << 10, max_bytes = 64 << 20;
  double seconds_per_size = 0.3;
  app.add_option("--min-bytes", min_bytes, "smallest buffer (bytes of the full tensor)");
  app.add_option("--max-bytes", max_bytes, "largest buffer");
  app.add_option("--seconds-per-size", seconds_per_size, "time budget per size and collective");
  bool gloo_native = false;
  app.add_flag("--gloo-native", gloo_native, "also time Gloo's own _allgather_base and _reduce_scatter_base");
  CLI11_PARSE(app, argc, argv);

  // The cross-rank consistency check costs one small exchange per call; measure the wire.
  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int n = world.size(), rank = world.rank();
  if (rank == 0) {
    std::printf("# fsdpp collectives, %d ranks, float32, Gloo over loopback\n", n);
    std::printf("# busbw: all_reduce = algbw*2(N-1)/N; all_gather/reduce_scatter = algbw*(N-1)/N (nccl-tests)\n");
    std::printf("# wire: bytes rank 0 sent per call as CommDebugMode counts / as the kernel counted (wchar)\n");
    std::printf("%12s %-24s %10s %10s %10s %14s %14s %12s\n", "bytes", "collective", "time_us", "algbw_GB/s",
                "busbw_GB/s", "wire_counted", "wire_kernel", "ideal");
  }
  double busbw_at_max[5] = {0, 0, 0, 0, 0};
  const char* names[5] = {"all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "gloo _allgather_base",
                          "gloo _reduce_scatter_base"};
  const auto c10d_group = world.backend();
  if (gloo_native) {
    try {  // both throw "not supported" where libtorch's Gloo lacks them
      at::Tensor full = at::ones({n}), shard = at::ones({1});
      fsdpp::compat::all_gather_single(*c10d_group, full, shard)->wait();
      fsdpp::compat::reduce_scatter_single(*c10d_group, shard, full)->wait();
    } catch (const c10::Error& e) {
      if (rank == 0) std::printf("# --gloo-native: this libtorch's Gloo has no such collective: %s\n", e.what_without_backtrace());
      gloo_native = false;
    }
  }
  const int kinds = gloo_native ? 5 : 3;
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int64_t numel = bytes / 4 / n * n;
    at::Tensor full = at::ones({numel}), shard = at::ones({numel / n});
    // Aim at the time budget from one timed call.
    auto t0 = std::chrono::steady_clock::now();
    fsdpp::all_reduce(full);
    double once = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    at::Tensor est = at::tensor({once}, at::kDouble);
    fsdpp::all_reduce(est, fsdpp::ReduceOp::MAX);
    const int iterations = std::max(3, std::min(200, static_cast<int>(seconds_per_size / est.item<double>())));
    Result results[5] = {
        measure([&] { fsdpp::all_gather_into_tensor(full, shard); }, iterations),
        measure([&] { fsdpp::reduce_scatter_tensor(shard, full); }, iterations),
        measure([&] { fsdpp::all_reduce(full); }, iterations),
    };
    if (gloo_native) {
      results[3] = measure([&] { fsdpp::compat::all_gather_single(*c10d_group, full, shard)->wait(); }, iterations);
      results[4] = measure([&] { fsdpp::compat::reduce_scatter_single(*c10d_group, shard, full)->wait(); }, iterations);
    }
    const double s = numel * 4.0;
    for (int k = 0; k < kinds; ++k) {
      const double algbw = s / results[k].seconds / 1e9;
      const double factor = k == 2 ? 2.0 * (n - 1) / n : double(n - 1) / n;
      const double busbw = algbw * factor;
      if (bytes * 4 > max_bytes) busbw_at_max[k] = busbw;
      if (rank == 0)
        std::printf("%12lld %-24s %10.1f %10.3f %10.3f %14lld %14lld %12.0f\n", static_cast<long long>(s), names[k],
                    results[k].seconds * 1e6, algbw, busbw, static_cast<long long>(results[k].counted),
                    static_cast<long long>(results[k].kernel), factor * s);
    }
  }
  if (rank == 0 && n > 1) {
    std::printf("\nbus bandwidth vs all_reduce at the largest size: all_gather %.2fx, reduce_scatter %.2fx (target >= 0.8x)\n",
                busbw_at_max[0] / busbw_at_max[2], busbw_at_max[1] / busbw_at_max[2]);
    if (gloo_native)
      std::printf("Gloo's own, vs all_reduce at the largest size: _allgather_base %.2fx, _reduce_scatter_base %.2fx\n",
                  busbw_at_max[3] / busbw_at_max[2], busbw_at_max[4] / busbw_at_max[2]);
  }
  fsdpp::barrier();
  return 0;
}

// The main job until FSDP lands: every rank checks every collective against values it can
// compute alone, then measures each one's bandwidth. Runs under fsdpp-run or torchrun:
//   fsdpp-run --nproc-per-node 4 collectives_check
#include <chrono>
#include <cstdio>
#include <string>

#include <ATen/ATen.h>

#include <fsdpp/fsdpp.h>

#include "standalone.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

at::Tensor values(int rank, int64_t numel, at::ScalarType dtype) {
  return (at::arange(numel, at::kLong) % 5 + rank).to(dtype);
}

at::Tensor sum_over_ranks(int n, int64_t numel, at::ScalarType dtype) {
  at::Tensor total = at::zeros({numel}, at::kLong);
  for (int r = 0; r < n; ++r) total += values(r, numel, at::kLong);
  return total.to(dtype);
}

void check_collectives(int rank, int n) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kLong}) {
    const std::string name = c10::toString(dtype);
    for (int64_t numel : {1, 7, 1001}) {
      at::Tensor t = values(rank, numel, dtype);
      fsdpp::all_reduce(t);
      expect(at::equal(t, sum_over_ranks(n, numel, dtype)), "all_reduce " + name);

      at::Tensor gathered = at::empty({n * numel}, dtype);
      fsdpp::all_gather_into_tensor(gathered, values(rank, numel, dtype));
      for (int r = 0; r < n; ++r)
        expect(at::equal(gathered.narrow(0, r * numel, numel), values(r, numel, dtype)), "all_gather_into_tensor " + name);

      at::Tensor shard = at::empty({numel}, dtype);
      fsdpp::reduce_scatter_tensor(shard, values(rank, n * numel, dtype));
      expect(at::equal(shard, sum_over_ranks(n, n * numel, dtype).narrow(0, rank * numel, numel)),
             "reduce_scatter_tensor " + name);

      at::Tensor b = values(rank, numel, dtype);
      fsdpp::broadcast(b, n - 1);
      expect(at::equal(b, values(n - 1, numel, dtype)), "broadcast " + name);

      at::Tensor a2a = at::empty({n * numel}, dtype);
      fsdpp::all_to_all_single(a2a, values(rank, n * numel, dtype));
      for (int r = 0; r < n; ++r)
        expect(at::equal(a2a.narrow(0, r * numel, numel), values(r, n * numel, dtype).narrow(0, rank * numel, numel)),
               "all_to_all_single " + name);
    }
  }
  std::string message = rank == 0 ? "hello from rank 0" : "";
  fsdpp::broadcast_bytes(message, 0);
  expect(message == "hello from rank 0", "broadcast_bytes");
  fsdpp::barrier();
}

// Seconds per call of `call` on the slowest rank.
template <typename F>
double time_per_call(F&& call, int iterations) {
  call();
  fsdpp::barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  at::Tensor t = at::tensor({std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations});
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX);
  return t.item<double>();
}

}  // namespace

int run() {
  auto world = fsdpp::examples::init_process_group_or_single_rank({}, "collectives_check");
  const int rank = world.rank(), n = world.size();
  check_collectives(rank, n);

  at::Tensor ok = at::tensor({failures == 0 ? 1 : 0}, at::kLong);
  fsdpp::all_reduce(ok, fsdpp::ReduceOp::MIN);
  if (rank == 0) std::printf("%s on %d ranks\n", ok.item<int64_t>() ? "all collectives correct" : "COLLECTIVES FAILED", n);

  const int64_t numel = (16 << 20) / 4 / n * n;  // 16 MiB of float32
  at::Tensor full = at::ones({numel}), shard = at::ones({numel / n});
  fsdpp::CommDebugMode mode;
  const double s = numel * 4.0, part = double(n - 1) / n;
  const double ag = time_per_call([&] { fsdpp::all_gather_into_tensor(full, shard); }, 5);
  const double rs = time_per_call([&] { fsdpp::reduce_scatter_tensor(shard, full); }, 5);
  const double ar = time_per_call([&] { fsdpp::all_reduce(full); }, 5);
  if (rank == 0) {
    std::printf("16 MiB float32, bus bandwidth (nccl-tests convention):\n");
    std::printf("  all_gather_into_tensor %.3f GB/s\n", s * part / ag / 1e9);
    std::printf("  reduce_scatter_tensor  %.3f GB/s\n", s * part / rs / 1e9);
    std::printf("  all_reduce             %.3f GB/s\n", s * 2 * part / ar / 1e9);
  }
  return ok.item<int64_t>() ? 0 : 1;
}

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_check: %s\n", e.what());
    return 1;
  }
}

// What a freshly mapped block costs against a reused one: the reason fsdpp's CPU allocator
// caches freed blocks (src/memory/block_cache.h). glibc serves large blocks with mmap and gives
// them back on free, so a training step that frees and re-allocates a unit-sized buffer faults
// every page in again; on some VMs each fault is far dearer than the memset.
//   bench_fresh_pages [--mib 3] [--rounds 200]
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include <CLI/CLI.hpp>

namespace {
volatile char sink;  // reads of the blocks, so no memset is optimised away
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Touching a fresh mapping vs a reused block"};
  double mib = 3;
  int rounds = 200;
  app.add_option("--mib", mib, "block size in MiB");
  app.add_option("--rounds", rounds);
  CLI11_PARSE(app, argc, argv);
  const size_t bytes = static_cast<size_t>(mib * (1 << 20));
  using clock = std::chrono::steady_clock;
  auto ms_per_round = [&](clock::time_point start) {
    return std::chrono::duration<double, std::milli>(clock::now() - start).count() / rounds;
  };
  auto start = clock::now();
  for (int i = 0; i < rounds; ++i) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    std::memset(p, i, bytes);
    sink = static_cast<volatile char*>(p)[bytes - 1];
    munmap(p, bytes);
  }
  const double fresh = ms_per_round(start);
  std::vector<char> reused(bytes);
  start = clock::now();
  for (int i = 0; i < rounds; ++i) {
    std::memset(reused.data(), i, bytes);
    sink = static_cast<volatile char*>(reused.data())[bytes - 1];
  }
  const double warm = ms_per_round(start);
  std::printf("%.1f MiB block: fresh mapping %.3f ms, reused block %.3f ms (%.1fx); %.2f us per fresh 4 KiB page\n",
              mib, fresh, warm, fresh / warm, fresh * 1e3 / (bytes / 4096.0));
  return 0;
}

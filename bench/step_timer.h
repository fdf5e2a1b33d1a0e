#pragma once
// The step timing the FSDP benchmarks share: a median over steps, ranks started together, the
// slowest rank's median reported.
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include <sys/resource.h>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/process_group.h>

namespace fsdpp::bench {

// Median seconds of `step` over `steps` runs after `warmup`; with a group, every run starts
// at a barrier and the result is the group's maximum median.
inline double median_step(const std::function<void()>& step, int warmup, int steps, const ProcessGroup* group) {
  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    if (group) barrier(*group);
    auto start = std::chrono::steady_clock::now();
    step();
    if (i >= warmup) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  if (group) {
    at::Tensor t = at::tensor(std::vector<double>{median}, at::kDouble);
    all_reduce(t, ReduceOp::MAX, *group);
    median = t.item<double>();
  }
  return median;
}

// Minor page faults of this process so far: fresh pages touched (on the benchmark VM each
// costs ~25 us, so they show up in step times).
inline long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace fsdpp::bench

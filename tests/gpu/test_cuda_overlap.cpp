// Issue 37's tier 1: FSDP's communication overlaps its compute on one GPU, proved by timing in
// one process that plays rank 0 of 2 over the fake backend (comm/fake_backend.h). A port of
// PyTorch's test_fully_shard_overlap.py (test_fully_shard_training_overlap): three units whose
// forward and backward spin a CUDA sleep kernel of compute_ms (backward twice that) on the
// compute stream, and fake collectives that spin one of comm_ms on the group's device stream.
// Step times are compared with the same collectives issued one after another before the plain
// model's compute (the serialized sum), and with the overlapped expectation, both in sleep
// times measured in this run (the sleep's cycles per ms drift with the GPU's clock).
// What it cannot show: that the bytes or numbers are right (the fake moves none: the parity
// tests of test_cuda_fully_shard.cpp do), nor NCCL's own kernels contending with compute.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include <torch/cuda.h>
#include <torch/torch.h>

#include <fsdpp/collectives.h>

#include "comm/fake_backend.h"
#include "compat/cuda_runtime.h"
#include "gpu/gpu_fixtures.h"

namespace fsdpp {
namespace {

using testing::kGpu;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kDim = 4, kUnits = 3, kComputeMs = 25, kCommMs = 10;

std::chrono::microseconds ms(double m) { return std::chrono::microseconds(static_cast<int64_t>(m * 1000)); }

// PyTorch's Matmul: a sleep of sleep_ms before the product, twice that before its gradients.
struct MatmulWithSleep : torch::autograd::Function<MatmulWithSleep> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight, int64_t sleep_ms) {
    ctx->save_for_backward({input, weight});
    ctx->saved_data["sleep_ms"] = sleep_ms;
    compat::cuda_sleep(ms(static_cast<double>(sleep_ms)));
    return input.matmul(weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    compat::cuda_sleep(ms(2.0 * static_cast<double>(ctx->saved_data["sleep_ms"].toInt())));
    const at::Tensor& grad = grad_outputs[0];
    return {grad.matmul(saved[1].t()), saved[0].t().matmul(grad), at::Tensor()};
  }
};

struct LinearWithSleepImpl : torch::nn::Module {
  explicit LinearWithSleepImpl(int64_t sleep_ms) : sleep_ms(sleep_ms) {
    weight = register_parameter("weight", torch::randn({kDim, kDim}));
  }
  at::Tensor forward(const at::Tensor& x) { return torch::relu(MatmulWithSleep::apply(x, weight, sleep_ms)); }
  at::Tensor weight;
  int64_t sleep_ms;
};
TORCH_MODULE(LinearWithSleep);

// The least of three timings of `fn`, from an idle GPU to an idle GPU.
double least_ms_of_three(const std::function<void()>& fn) {
  double least = 1e30;
  for (int i = 0; i < 3; ++i) {
    torch::cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    fn();
    torch::cuda::synchronize();
    least = std::min(least, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  return least;
}

// One all-gather as FSDP's of `weight` would be, issued alone: the comm stream runs it after
// what the compute stream holds, and the caller waits for it.
void dummy_all_gather(const at::Tensor& weight) {
  at::Tensor output = at::empty_like(weight);
  all_gather_into_tensor(output, output.chunk(2)[0].contiguous());
}

void dummy_reduce_scatter(const at::Tensor& weight) {
  at::Tensor input = at::empty_like(weight);
  at::Tensor output = input.chunk(2)[0].contiguous();
  reduce_scatter_tensor(output, input);
}

void expect_training_overlap(RankContext&) {
  init_process_group(InitProcessGroupOptions().backend("fake").rank(0).world_size(2));
  torch::manual_seed(42);
  torch::nn::Sequential plain;
  for (int i = 0; i < kUnits; ++i) plain->push_back(LinearWithSleep(kComputeMs));
  torch::nn::Sequential units;
  for (int i = 0; i < kUnits; ++i) {
    auto copy = LinearWithSleep(kComputeMs);
    copy->weight.data().copy_(plain[i]->as<LinearWithSleepImpl>()->weight);
    copy->to(kGpu);
    units->push_back(fully_shard(copy, FullyShardOptions().reshard_after_forward(true)));
  }
  plain->to(kGpu);
  auto model = fully_shard(units, FullyShardOptions().reshard_after_forward(true));
  const at::Tensor input = torch::randn({2, kDim}).to(kGpu);

  // Warm-up (CUDA, the allocator, FSDP's recorded order, the sleep's calibration) without delays.
  model->forward(input).sum().backward();
  plain->forward(input).sum().backward();
  compat::cuda_sleep(ms(1));
  detail::set_fake_collective_duration(ms(kCommMs));

  // The sleeps as this GPU runs them now: one compute unit, one collective after it.
  const double compute = least_ms_of_three([] { compat::cuda_sleep(ms(kComputeMs)); });
  const double comm = least_ms_of_three([&] { dummy_all_gather(plain[0]->as<LinearWithSleepImpl>()->weight); });

  const auto weights = [&] {
    std::vector<at::Tensor> w;
    for (const auto& p : plain->parameters()) w.push_back(p.detach());
    return w;
  }();
  // Forward alone without autograd's graph (no backward follows it); the prefetch is the same.
  const double serialized_forward = least_ms_of_three([&] {
    torch::NoGradGuard no_grad;
    for (const auto& w : weights) dummy_all_gather(w);
    plain->forward(input);
  });
  const double forward = least_ms_of_three([&] {
    torch::NoGradGuard no_grad;
    model->forward(input);
  });

  const double serialized_step = least_ms_of_three([&] {
    for (const auto& w : weights) dummy_all_gather(w);
    at::Tensor loss = plain->forward(input).sum();
    for (const auto& w : weights) dummy_all_gather(w);  // resharded after forward
    loss.backward();
    for (const auto& w : weights) dummy_reduce_scatter(w);
  });
  const double step = least_ms_of_three([&] { model->forward(input).sum().backward(); });
  detail::set_fake_collective_duration(std::chrono::microseconds(0));

  // Forward: only the first all-gather is exposed. Forward and backward: the first all-gather
  // of each and the last reduce-scatter; backward computes twice as long as forward.
  const double expected_forward = comm + kUnits * compute;
  const double expected_step = expected_forward + 2 * comm + 2 * kUnits * compute;
  const double buffer_ms = 4;  // PyTorch's allowance for the host's delays and the copies
  const std::string times = "compute " + std::to_string(compute) + " ms, collective " + std::to_string(comm) +
                            " ms; forward " + std::to_string(forward) + " ms (serialized " +
                            std::to_string(serialized_forward) + ", overlapped " + std::to_string(expected_forward) +
                            "); forward+backward " + std::to_string(step) + " ms (serialized " +
                            std::to_string(serialized_step) + ", overlapped " + std::to_string(expected_step) + ")";
  std::printf("CudaOverlap: %s\n", times.c_str());
  EXPECT_LT(forward, serialized_forward) << times;
  EXPECT_LT(step, serialized_step) << times;
  EXPECT_LE(forward, expected_forward + buffer_ms) << times;
  EXPECT_LE(step, expected_step + 2 * buffer_ms) << times;
  destroy_process_group();
}

TEST(CudaOverlap, FullyShardOverlapsCommunicationWithComputeOnTheFakeBackend) {
  FSDPP_SKIP_WITHOUT_CUDA();
  testing::RunOptions options;
  options.init_process_group = false;
  run_ranks(1, expect_training_overlap, options);
}

}  // namespace
}  // namespace fsdpp

// BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND (the default): a unit prefetches the next unit of
// backward only where that keeps the step within the memory alive at the end of forward plus
// two of the largest unit; the first backward measures, then the ranks agree.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/memory.h>

#include "dist/fsdp_test_util.h"
#include "dist/world_sizes.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

using FSDPLinear = FullyShardedDataParallel<torch::nn::LinearImpl>;
using FSDPSequential = FullyShardedDataParallel<torch::nn::SequentialImpl>;

class BackwardPrefetchWithinBound : public testing::WorldSizeTest {};

// Four units of Linear(64, 64) and a root Linear(64, 1) on a batch of 1024 rows: the
// activations and the gradients flowing between units (1024 x 64, 15.75 units' parameters
// each) dwarf the units. The step's peak is in the root's window: the backward of the ReLU after
// unit 3 holds two such gradients. So the root does not prefetch unit 3, while units 3, 2 and 1
// (their windows lower by more than a unit) prefetch the next.
// Counted: all-gathers in backward when backward reaches unit 3's output, and unit 3's and
// unit 2's inputs.
struct Counts {
  int64_t at_unit3_output = -1, at_unit3_input = -1, at_unit2_input = -1;
};

struct Fixture {
  Sequential seq;
  FSDPSequential root{nullptr};  // null: the plain model
  CommDebugMode* comm = nullptr;
  Counts counts;
  // Bytes allocated from unit 2's output gradient to its input gradient (in unit 2's window).
  int64_t extra_in_unit2_window = 0;
  at::Tensor extra;

  Fixture(const std::optional<BackwardPrefetch>& timing, bool wrap) {
    auto options = FullyShardOptions().backward_prefetch(timing);
    auto on_gradient = [this](int k, bool output) {
      return torch::nn::Functional([this, k, output](at::Tensor x) {
        if (x.requires_grad())
          x.register_hook([this, k, output](const at::Tensor& g) {
            const int64_t gathers = comm ? comm->count("all_gather_into_tensor") : -1;
            if (k == 3) (output ? counts.at_unit3_output : counts.at_unit3_input) = gathers;
            if (k == 2 && !output) counts.at_unit2_input = gathers;
            if (k == 2 && output && extra_in_unit2_window > 0) extra = torch::ones({extra_in_unit2_window / 4});
            if (k == 2 && !output) extra = at::Tensor();
            return g;
          });
        return x;
      });
    };
    torch::manual_seed(5);
    for (int k = 0; k < 4; ++k) {
      seq->push_back(on_gradient(k, false));
      if (wrap)
        seq->push_back(FSDPLinear(Linear(64, 64), options));
      else
        seq->push_back(Linear(64, 64));
      seq->push_back(on_gradient(k, true));
      seq->push_back(ReLU());
    }
    seq->push_back(Linear(64, 1));
    if (wrap) root = FSDPSequential(seq, options);
  }
  at::Tensor forward(const at::Tensor& x) { return root ? root->forward(x) : seq->forward(x); }
  std::vector<at::Tensor> parameters() { return root ? root->parameters() : seq->parameters(); }
};

at::Tensor run_step(Fixture& f, torch::optim::Optimizer& opt, const at::Tensor& x) {
  opt.zero_grad();
  CommDebugMode mode;
  f.comm = &mode;
  f.counts = Counts{};
  at::Tensor loss = f.forward(x).pow(2).mean();
  mode.reset();
  loss.backward();
  f.comm = nullptr;
  opt.step();
  return loss.detach();
}

TEST_P(BackwardPrefetchWithinBound, PrefetchesWhereItFitsAfterTheFirstBackward) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    EXPECT_EQ(FullyShardOptions().backward_prefetch(), BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND) << "the default";
    torch::manual_seed(11);
    const at::Tensor x = torch::randn({1024, 64});
    struct Case {
      std::optional<BackwardPrefetch> timing;
      Counts steady;
      const char* label;
    };
    // Unit 3's own gather counts 1 (0 at its output unless the root prefetched it); unit 2's
    // prefetch by unit 3 makes 2 at unit 3's input; unit 1's by unit 2 makes 3 at unit 2's.
    for (const Case& c : {Case{BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND, {0, 2, 3}, "within bound"},
                          Case{BackwardPrefetch::BACKWARD_PRE, {1, 2, 3}, "BACKWARD_PRE"},
                          Case{std::nullopt, {0, 1, 2}, "none"}}) {
      Fixture f(c.timing, true);
      torch::optim::SGD opt(f.parameters(), 0.01);
      run_step(f, opt, x);
      if (c.timing == BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND) {
        EXPECT_EQ(f.counts.at_unit2_input, 2) << c.label << ": the first backward measures and prefetches nothing";
      }
      for (int step = 1; step < 3; ++step) {
        run_step(f, opt, x);
        const std::string where = std::string(c.label) + ", step " + std::to_string(step) + ", rank " + std::to_string(ctx.rank);
        EXPECT_EQ(f.counts.at_unit3_output, c.steady.at_unit3_output) << where;
        EXPECT_EQ(f.counts.at_unit3_input, c.steady.at_unit3_input) << where;
        EXPECT_EQ(f.counts.at_unit2_input, c.steady.at_unit2_input) << where;
      }
    }
  });
}

// The peak it buys: the prefetches it makes (units 3, 2, 1) leave the step's peak where it is
// without any. (What BACKWARD_PRE adds, the root's prefetch of unit 3 in the peak's window, is
// allocated by the comm thread, maybe only after that peak: no test here can rely on seeing it.
// PrefetchesWhereItFitsAfterTheFirstBackward shows that the root does not prefetch.)
TEST_P(BackwardPrefetchWithinBound, StepPeakAsWithoutPrefetch) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(11);
    const at::Tensor x = torch::randn({1024, 64});
    std::vector<double> peaks;
    double u = 0;
    for (auto timing : {std::optional<BackwardPrefetch>(BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND),
                        std::optional<BackwardPrefetch>()}) {
      Fixture f(timing, true);
      torch::optim::SGD opt(f.parameters(), 0.01);
      for (int step = 0; step < 2; ++step) run_step(f, opt, x);
      u = static_cast<double>(fsdp_units(*f.root)[1]->unsharded_padded_numel()) * 4;
      for (auto& p : f.parameters())
        if (p.grad().defined()) p.mutable_grad().zero_();
      reset_peak_memory_stats();
      const double held = static_cast<double>(memory_stats().current_bytes);
      at::Tensor loss = f.forward(x).pow(2).mean();
      const double after_forward = static_cast<double>(memory_stats().current_bytes) - held;
      loss.backward();
      peaks.push_back(static_cast<double>(memory_stats().peak_bytes) - held - after_forward);
    }
    // (a reduce-scatter output, U / N, may be in flight in one and not the other)
    EXPECT_LE(peaks[0], peaks[1] + u / ctx.world_size + 0.1 * u)
        << "within bound " << peaks[0] / u << " U above forward's memory, without prefetch " << peaks[1] / u << " U";
  });
}

// Rank 0 alone allocates 40 units in unit 2's window in the first backward, which makes that
// window its peak: rank 0 finds that neither unit 2's prefetch fits nor unit 3's (whose
// reduce-scatter input would then outlive its window into unit 2's), the others that both do.
// The ranks agree on the minimum, so no rank prefetches unit 2 or unit 1 (and every rank issues
// its collectives in one order: else one rank's gather of unit 1 would meet another's
// reduce-scatter of unit 2); training stays at parity with the plain model.
TEST_P(BackwardPrefetchWithinBound, RanksAgreeOnTheDecision) {
  run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(11);
    const at::Tensor x = torch::randn({1024, 64});
    Fixture f(BackwardPrefetch::BACKWARD_PRE_WITHIN_BOUND, true), ref(std::nullopt, false);
    torch::optim::SGD opt(f.parameters(), 0.01), ref_opt(ref.parameters(), 0.01);
    const int64_t u = fsdp_units(*f.root)[1]->unsharded_padded_numel() * 4;
    for (int step = 0; step < 3; ++step) {
      f.extra_in_unit2_window = step == 0 && ctx.rank == 0 ? 40 * u : 0;
      const at::Tensor loss = run_step(f, opt, x);
      const at::Tensor ref_loss = run_step(ref, ref_opt, x);
      EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-5) << "step " << step << ", rank " << ctx.rank;
      if (step > 0) {
        EXPECT_EQ(f.counts.at_unit3_input, 1) << "step " << step << ", rank " << ctx.rank;
        EXPECT_EQ(f.counts.at_unit2_input, 2) << "step " << step << ", rank " << ctx.rank;
      }
    }
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(BackwardPrefetchWithinBound);

}  // namespace
}  // namespace fsdpp

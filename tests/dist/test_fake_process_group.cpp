// The fake backend (comm/fake_backend.h): one process plays rank r of N with no rendezvous and no
// peers, every collective completes without moving data, CommDebugMode counts what rank r of N
// would send, and FSDP trains with rank r of N's shards and per-step traffic, both checked
// against a real run of N ranks. Each fake world lives in a child process of its own
// (run_ranks(1) without a group), so the default group it sets dies with it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/device_mesh.h>

#include "comm/fake_backend.h"
#include "comm/wire_bytes.h"
#include "dist/fsdp_test_util.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

using Clock = std::chrono::steady_clock;
using testing::error_of;

// Runs `body` in a child process as rank `rank` of a fake world of `world_size`.
void as_fake_rank(int rank, int world_size, const std::function<void(ProcessGroup&)>& body) {
  testing::RunOptions options;
  options.init_process_group = false;
  run_ranks(1, [&](RankContext&) {
    ProcessGroup world = init_process_group(
        InitProcessGroupOptions().backend("fake").rank(rank).world_size(world_size).timeout(std::chrono::seconds(20)));
    body(world);
    destroy_process_group();
  }, options);
}

int64_t since_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

TEST(FakeProcessGroup, JoinsAloneAsRankOneOfFour) {
  as_fake_rank(1, 4, [](ProcessGroup& world) {
    EXPECT_EQ(world.rank(), 1);
    EXPECT_EQ(world.size(), 4);
    EXPECT_TRUE(world.is_member());
    EXPECT_EQ(default_group().size(), 4);
    ASSERT_TRUE(world.backend());
    EXPECT_EQ(world.backend()->getRank(), 1);
    EXPECT_EQ(world.backend()->getSize(), 4);
    EXPECT_EQ(world.backend()->getBackend(c10::DeviceType::CPU)->getBackendName(), "fake");
  });
}

TEST(FakeProcessGroup, RefusesARankOutsideItsWorld) {
  as_fake_rank(0, 1, [](ProcessGroup&) {
    const std::string error = error_of([] {
      init_process_group(InitProcessGroupOptions().backend("fake").rank(4).world_size(4));
    });
    EXPECT_NE(error.find("rank 4 is outside a world of size 4"), std::string::npos) << error;
  });
}

// Every collective completes, leaves its input as it was and its output as it was (a real
// exchange would at least place this rank's own block), and CommDebugMode counts what rank 1
// of 4 sends: the formulas of CommDebugModeTest, which a group of one would count as 0.
TEST(FakeProcessGroup, EveryCollectiveCompletesAndMovesNothing) {
  as_fake_rank(1, 4, [](ProcessGroup&) {
    const int64_t n = 4, rank = 1;
    const at::Tensor values = at::arange(1, 13, at::kFloat);  // 12 elements, divisible by 4
    auto expect_untouched = [](const at::Tensor& t, const at::Tensor& was, const std::string& what) {
      EXPECT_TRUE(t.equal(was)) << what << ": " << t;
    };
    CommDebugMode mode;

    at::Tensor t = values.clone();
    all_reduce(t, ReduceOp::SUM);
    all_reduce(t, ReduceOp::AVG);  // no division by 4 either
    all_reduce(t, ReduceOp::MAX);
    expect_untouched(t, values, "all_reduce");
    at::Tensor bf = values.to(at::kBFloat16);
    all_reduce(bf, ReduceOp::SUM);
    expect_untouched(bf, values.to(at::kBFloat16), "bfloat16 all_reduce");
    EXPECT_EQ(mode.count("all_reduce"), 4);
    EXPECT_EQ(mode.bytes_sent("all_reduce"),
              3 * detail::ring_all_reduce_bytes(48, 4, rank, n) + 2 * (n - 1) * ((12 + n - 1) / n) * 2);

    broadcast(t, 0);
    expect_untouched(t, values, "broadcast");
    EXPECT_EQ(mode.bytes_sent("broadcast"), detail::tree_broadcast_sends(rank, 0, n) * 48);

    const at::Tensor shard = values.narrow(0, 0, 3).clone();
    at::Tensor gathered = at::full({12}, -7.0f);
    all_gather_into_tensor(gathered, shard);
    expect_untouched(gathered, at::full({12}, -7.0f), "all_gather output");
    expect_untouched(shard, values.narrow(0, 0, 3), "all_gather input");
    EXPECT_EQ(mode.bytes_sent("all_gather_into_tensor"), (n - 1) * 3 * 4);

    at::Tensor reduced = at::full({3}, -7.0f), full = values.clone();
    reduce_scatter_tensor(reduced, full, ReduceOp::AVG);
    expect_untouched(reduced, at::full({3}, -7.0f), "reduce_scatter output");
    expect_untouched(full, values, "reduce_scatter input");
    EXPECT_EQ(mode.bytes_sent("reduce_scatter_tensor"), (n - 1) * 3 * 4);

    at::Tensor exchanged = at::full({12}, -7.0f);
    all_to_all_single(exchanged, full);
    expect_untouched(exchanged, at::full({12}, -7.0f), "all_to_all output");
    EXPECT_EQ(mode.bytes_sent("all_to_all_single"), (n - 1) * 3 * 4);

    std::string bytes = "rank 1's own";  // a real broadcast from 0 would replace it
    broadcast_bytes(bytes, 0);
    EXPECT_EQ(bytes, "rank 1's own");
    EXPECT_EQ(mode.bytes_sent("broadcast_bytes"), detail::tree_broadcast_sends(rank, 0, n) * (8 + 12));

    Work barrier_work = barrier(ProcessGroup(), /*async_op=*/true);
    Work async_reduce = all_reduce(t, ReduceOp::SUM, ProcessGroup(), /*async_op=*/true);
    async_reduce.wait();
    barrier_work.wait();
    EXPECT_TRUE(async_reduce.is_completed());
    EXPECT_TRUE(barrier_work.is_completed());
    expect_untouched(t, values, "async all_reduce");
    EXPECT_EQ(mode.get_total_counts(), 11);
  });
}

// Subgroups and meshes are made without any exchange, and their collectives complete.
TEST(FakeProcessGroup, SubgroupsAndMeshesOfRankOne) {
  as_fake_rank(1, 4, [](ProcessGroup& world) {
    ProcessGroup pair = world.new_group({0, 1});
    ProcessGroup others = world.new_group({2, 3});
    EXPECT_TRUE(pair.is_member());
    EXPECT_EQ(pair.rank(), 1);
    EXPECT_EQ(pair.size(), 2);
    EXPECT_FALSE(others.is_member());
    at::Tensor t = at::ones({4});
    all_reduce(t, ReduceOp::SUM, pair);
    EXPECT_TRUE(t.equal(at::ones({4})));
    EXPECT_NE(error_of([&] { all_reduce(t, ReduceOp::SUM, others); }).find("is not a member"), std::string::npos);

    // [[0, 1], [2, 3]]: rank 1 is in row {0, 1} and column {1, 3}.
    DeviceMesh mesh = init_device_mesh(world, {2, 2}, {"replicate", "shard"});
    EXPECT_EQ(mesh.get_group("shard").ranks(), std::vector<int>({0, 1}));
    EXPECT_EQ(mesh.get_group("replicate").ranks(), std::vector<int>({1, 3}));
    EXPECT_EQ(mesh.get_group("replicate").rank(), 0);
    barrier(mesh.get_group("replicate"));
  });
}

// The group's comm thread still runs the collectives, one after another in issue order:
// with the testing delay, an async collective returns at once, is not complete until its
// delay has passed, and two take two delays.
TEST(FakeProcessGroup, CollectivesRunOnTheCommThreadInIssueOrder) {
  as_fake_rank(1, 4, [](ProcessGroup&) {
    constexpr int64_t kDelayMs = 400;
    detail::set_fake_collective_duration(std::chrono::milliseconds(kDelayMs));
    at::Tensor a = at::ones({8}), b = at::ones({8});
    const auto start = Clock::now();
    Work first = all_reduce(a, ReduceOp::SUM, ProcessGroup(), /*async_op=*/true);
    Work second = all_reduce(b, ReduceOp::SUM, ProcessGroup(), /*async_op=*/true);
    const int64_t issued_ms = since_ms(start);
    EXPECT_FALSE(second.is_completed()) << "after " << since_ms(start) << " ms";
    first.wait();
    EXPECT_GE(since_ms(start), kDelayMs);
    second.wait();
    EXPECT_GE(since_ms(start), 2 * kDelayMs) << "the second ran beside the first";
    EXPECT_LT(issued_ms, kDelayMs) << "issuing waited for the exchange";
    detail::set_fake_collective_duration(std::chrono::microseconds(0));
    const auto undelayed = Clock::now();
    all_reduce(a, ReduceOp::SUM);
    EXPECT_LT(since_ms(undelayed), kDelayMs);
  });
}

// One training run of make_multi_group as rank `rank` of the current world: per step, each
// collective's count and bytes from CommDebugMode, then every parameter's (shard's) shape.
std::string train_and_record(int rank, const FullyShardOptions& options) {
  torch::manual_seed(42);
  FSDPSequential model(make_multi_group(true, options), options);
  auto opt = make_optimizer(Optim::kAdam, model->parameters());
  const int64_t local = kGlobalBatch / 4;
  std::ostringstream record;
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(1000 + step);
    const at::Tensor x = torch::randn({kGlobalBatch, 7}).narrow(0, rank * local, local);
    const at::Tensor y = torch::randn({kGlobalBatch, 3}).narrow(0, rank * local, local);
    CommDebugMode mode;
    opt->zero_grad();
    (model->forward(x) - y).pow(2).mean().backward();
    opt->step();
    for (const auto& [collective, count] : mode.get_comm_counts())
      record << "step " << step << " " << collective << " x" << count << " " << mode.bytes_sent(collective) << " bytes\n";
  }
  for (const auto& p : model->named_parameters()) record << p.key() << " " << p.value().sizes() << "\n";
  return record.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// FSDP over a fake group of 4 trains in one process with rank r's shards and exactly rank r's
// per-step traffic of a real 4-rank run of the same model and options; the shard shapes also
// against the arithmetic of shard_rows. Ranks 1 and 3: rank 3 holds fewer rows (and the
// root's 3-row Linear none), so a fake that played rank 0 would show.
TEST(FakeProcessGroup, FullyShardTrainsAsRankROfFourWithTheRealRunsTraffic) {
  char dir_template[] = "/tmp/fsdpp_fake_XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  for (const auto& [options, raf] : reshard_after_forward_sweep(4)) {
    run_ranks(4, [&](RankContext& ctx) {
      const std::string record = train_and_record(ctx.rank, options);
      std::ofstream(dir + "/real" + std::to_string(ctx.rank)) << record;
    });
    for (int rank : {1, 3}) {
      as_fake_rank(rank, 4, [&](ProcessGroup&) {
        const std::string record = train_and_record(rank, options);
        std::ofstream(dir + "/fake" + std::to_string(rank)) << record;
        torch::manual_seed(42);
        Sequential plain = make_multi_group(false, options);
        torch::manual_seed(42);
        FSDPSequential model(make_multi_group(true, options), options);
        const auto full = plain->parameters(), shards = model->parameters();
        ASSERT_EQ(full.size(), shards.size());
        for (size_t i = 0; i < full.size(); ++i)
          EXPECT_EQ(shards[i].sizes(), shard_rows(full[i], rank, 4).sizes()) << raf << " parameter " << i;
      });
      const std::string real = read_file(dir + "/real" + std::to_string(rank));
      const std::string fake = read_file(dir + "/fake" + std::to_string(rank));
      EXPECT_NE(real.find("step 2 all_gather_into_tensor"), std::string::npos) << real;
      EXPECT_NE(real.find("step 2 reduce_scatter_tensor"), std::string::npos) << real;
      EXPECT_EQ(fake, real) << raf << ", rank " << rank << " of 4";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace fsdpp

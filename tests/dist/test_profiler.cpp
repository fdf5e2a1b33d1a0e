// fsdpp::profiler: a Chrome trace of each rank's collectives (issued, run on the comm thread,
// waited on), FSDP's per-unit spans, and the user's record_function spans.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include <nlohmann/json.hpp>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/error.h>
#include <fsdpp/memory.h>
#include <fsdpp/profiler.h>

#include "dist/fsdp_test_util.h"
#include "dist/profiler_trace.h"
#include "harness/error_of.h"

namespace fsdpp {
namespace {

using nlohmann::json;
using testing::end_of;
using testing::Trace;

class ProfilerTest : public testing::WorldSizeTest {};

TEST_P(ProfilerTest, RecordsEachCollectiveIssuedRunAndWaited) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size;
    at::Tensor t = at::ones({1 << 10});
    at::Tensor shard = at::ones({100}), full = at::empty({100 * n});
    all_reduce(t);  // before recording: not in the trace
    CommDebugMode mode;
    profiler::start();
    {
      profiler::record_function step("step");
      all_reduce(t);
      Work gather = all_gather_into_tensor(full, shard, {}, /*async_op=*/true);
      { profiler::record_function compute("compute"); }
      gather.wait();
    }
    profiler::stop();
    const int64_t all_reduce_bytes = mode.bytes_sent("all_reduce");
    const int64_t all_gather_bytes = mode.bytes_sent("all_gather_into_tensor");
    all_reduce(t);  // after: not in the trace either
    const std::string path = ctx.temp_dir + "/rank-" + std::to_string(ctx.rank) + ".json";
    profiler::export_chrome_trace(path);
    const Trace trace(path);

    bool named_process = false;
    for (const auto& e : trace.events)
      if (e.at("name") == "process_name") named_process = e.at("args").at("name") == "rank " + std::to_string(ctx.rank);
    EXPECT_TRUE(named_process);
    for (const auto& e : trace.events) EXPECT_EQ(e.at("pid"), ctx.rank);
    // all_reduce #0 ran before recording and #3 after; #1 (all_reduce) and #2 (all_gather) inside.
    EXPECT_TRUE(trace.named("all_reduce #0 ").empty());
    EXPECT_TRUE(trace.named("all_reduce #3 ").empty());
    const json& step = trace.only("step");
    const json& compute = trace.only("compute");
    EXPECT_LE(step.at("ts"), compute.at("ts"));
    EXPECT_LE(end_of(compute), end_of(step));
    EXPECT_EQ(step.at("tid"), compute.at("tid"));

    for (const std::string kind : {"all_reduce #1 world", "all_gather_into_tensor #2 world"}) {
      SCOPED_TRACE(kind);
      const json& issue = trace.only("issue " + kind);
      const json& run = trace.only(kind);
      const json& wait = trace.only("wait " + kind);
      EXPECT_EQ(issue.at("ph"), "i");
      EXPECT_EQ(issue.at("args").at("in"), "step");
      EXPECT_EQ(issue.at("tid"), step.at("tid"));
      EXPECT_EQ(run.at("ph"), "X");
      EXPECT_EQ(trace.track_names.at(run.at("tid").get<int>()), "comm thread of group world");
      EXPECT_NE(run.at("tid"), step.at("tid"));
      EXPECT_EQ(run.at("args").at("issued in"), "step");
      EXPECT_EQ(wait.at("tid"), step.at("tid"));
      // Issued, then run, then the wait returned; all inside the step.
      EXPECT_LE(step.at("ts"), issue.at("ts"));
      EXPECT_LE(issue.at("ts"), run.at("ts"));
      EXPECT_LE(end_of(run), end_of(wait));
      EXPECT_LE(end_of(wait), end_of(step));
    }
    EXPECT_EQ(trace.only("all_reduce #1 world").at("args").at("bytes sent"), std::to_string(all_reduce_bytes));
    EXPECT_EQ(trace.only("all_gather_into_tensor #2 world").at("args").at("bytes sent"),
              std::to_string(all_gather_bytes));
    // The asynchronous all-gather was waited on after the compute span.
    EXPECT_LE(end_of(compute), trace.only("wait all_gather_into_tensor #2 world").at("ts").get<long long>());

    // start() clears what the last recording left.
    profiler::start();
    profiler::stop();
    profiler::export_chrome_trace(path);
    EXPECT_TRUE(Trace(path).named("step").empty());
  });
}

// Every FSDP unit's all-gather is issued inside its FSDP::unshard span and its reduce-scatter
// inside its FSDP::post_backward span, so a trace shows which unit each collective serves.
TEST_P(ProfilerTest, FSDPUnitsNameTheirCollectives) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    const auto options = FullyShardOptions();
    FSDPSequential model(make_multi_group(true, options), options);
    const size_t units = fsdp_units(*model).size();
    ASSERT_EQ(units, 3u);
    profiler::start();
    at::Tensor loss;
    {
      profiler::record_function forward("forward");
      loss = model->forward(torch::randn({4, 7})).sum();
    }
    {
      profiler::record_function backward("backward");
      loss.backward();
    }
    profiler::stop();
    const std::string path = ctx.temp_dir + "/rank-" + std::to_string(ctx.rank) + ".json";
    profiler::export_chrome_trace(path);
    const Trace trace(path);

    std::set<std::string> unshard_spans, post_backward_spans, gathered_in, reduced_in;
    for (const auto& e : trace.named("FSDP::unshard ")) unshard_spans.insert(e.at("name"));
    for (const auto& e : trace.named("FSDP::post_backward ")) post_backward_spans.insert(e.at("name"));
    for (const auto& e : trace.named("all_gather_into_tensor #")) gathered_in.insert(e.at("args").at("issued in"));
    for (const auto& e : trace.named("reduce_scatter_tensor #")) reduced_in.insert(e.at("args").at("issued in"));
    EXPECT_EQ(unshard_spans.size(), units);
    EXPECT_EQ(post_backward_spans.size(), units);
    EXPECT_EQ(gathered_in, unshard_spans);
    if (ctx.world_size > 1) {
      EXPECT_EQ(reduced_in, post_backward_spans);
    }
    // The root's all-gather is issued inside forward, the gradients' reduce-scatters inside backward.
    const json& forward = trace.only("forward");
    const json& backward = trace.only("backward");
    for (const auto& e : trace.named("issue all_gather_into_tensor #"))
      EXPECT_TRUE(e.at("ts") >= forward.at("ts") && e.at("ts") <= end_of(backward)) << e;
    for (const auto& e : trace.named("issue reduce_scatter_tensor #"))
      EXPECT_TRUE(e.at("ts") >= backward.at("ts") && e.at("ts") <= end_of(backward)) << e;
    EXPECT_FALSE(trace.named("wait all_gather_into_tensor").empty());
    EXPECT_TRUE(trace.named("memory").empty()) << "memory is recorded only with profile_memory";
  });
}

// The memory counter samples every allocation and free of every thread (the comm threads'
// buffers too), so its highest sample is the step's peak.
TEST_P(ProfilerTest, MemoryCounterReachesTheStepsPeak) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    const auto options = FullyShardOptions();
    FSDPSequential model(make_multi_group(true, options), options);
    model->forward(torch::randn({4, 7})).sum().backward();  // lazy initialization is not the step
    reset_peak_memory_stats();
    profiler::start(profiler::ProfilerOptions().profile_memory(true));
    const int64_t allocations = memory_stats().num_allocations;
    model->forward(torch::randn({4, 7})).sum().backward();
    profiler::stop();
    const MemoryStats after = memory_stats();
    const std::string path = ctx.temp_dir + "/rank-" + std::to_string(ctx.rank) + ".json";
    profiler::export_chrome_trace(path);
    const std::vector<json> samples = Trace(path).named("memory");
    ASSERT_GT(samples.size(), 1u);
    int64_t highest = 0;
    for (const auto& s : samples) {
      EXPECT_EQ(s.at("ph"), "C") << s;
      highest = std::max(highest, s.at("args").at("bytes").get<int64_t>());
    }
    EXPECT_EQ(highest, after.peak_bytes);
    EXPECT_GE(static_cast<int64_t>(samples.size()), 1 + after.num_allocations - allocations);
  });
}

FSDPP_INSTANTIATE_WORLD_SIZES(ProfilerTest);

// One thread, nothing else allocating: the samples are exactly the totals after each event.
TEST(ProfilerMemory, SamplesTheTotalAtStartAndAfterEachAllocationAndFree) {
  const int64_t mib = 1 << 20;
  profiler::start(profiler::ProfilerOptions().profile_memory(true));
  const int64_t base = memory_stats().current_bytes;
  at::Tensor a = at::empty({mib}, at::kByte);
  at::Tensor b = at::empty({3 * mib}, at::kByte);
  a = at::Tensor();
  profiler::stop();
  b = at::Tensor();  // not recorded
  const std::string path = ::testing::TempDir() + "profiler-memory-" + std::to_string(getpid()) + ".json";
  profiler::export_chrome_trace(path);
  std::vector<int64_t> bytes;
  for (const auto& s : Trace(path).named("memory")) bytes.push_back(s.at("args").at("bytes").get<int64_t>());
  EXPECT_EQ(bytes, (std::vector<int64_t>{base, base + mib, base + 4 * mib, base + 3 * mib}));
}

// The trace's process is "rank R" (pid R) while a default group exists, "pid P" (the OS pid)
// before init_process_group and after destroy_process_group: the profiler is told the rank, it
// does not read the process group.
TEST(ProfilerLabel, RankWhileADefaultGroupExistsElseTheOsPid) {
  const std::string stem = ::testing::TempDir() + "profiler-label-" + std::to_string(getpid());
  auto label = [&](const std::string& path) {
    profiler::start();
    { profiler::record_function mark("mark"); }
    profiler::stop();
    profiler::export_chrome_trace(path);
    std::pair<std::string, std::set<int>> seen;
    for (const auto& e : Trace(path).events) {
      if (e.at("name") == "process_name") seen.first = e.at("args").at("name");
      seen.second.insert(e.at("pid").get<int>());
    }
    return seen;
  };
  const int pid = static_cast<int>(getpid());
  EXPECT_EQ(label(stem + "-before.json"), std::make_pair("pid " + std::to_string(pid), std::set<int>{pid}));
  std::remove((stem + ".store").c_str());
  init_process_group(InitProcessGroupOptions().init_method("file://" + stem + ".store").rank(0).world_size(1));
  EXPECT_EQ(label(stem + "-in.json"), std::make_pair(std::string("rank 0"), std::set<int>{0}));
  destroy_process_group();
  EXPECT_EQ(label(stem + "-after.json"), std::make_pair("pid " + std::to_string(pid), std::set<int>{pid}));
}

// HSDP on a 2 x 2 mesh, as FSDP2's foreach_reduce: each unit's all-reduce across the replicas is
// issued in its own post-backward, right after its reduce-scatter (so before the next unit's
// backward compute), and the replicate group's comm thread runs it only after waiting for that
// reduce-scatter. Not at the end of backward, where no compute would be left to overlap it.
// Checked from the order of the recorded events, never from durations.
TEST(ProfilerHSDP, ReplicateAllReduceIsIssuedInPostBackwardAfterTheReduceScatter) {
  testing::run_ranks(4, [](RankContext& ctx) {
    torch::manual_seed(0);
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"});
    const std::string replicate = mesh.get_group("replicate").name();
    const auto options = FullyShardOptions().mesh(mesh);
    FSDPSequential model(make_multi_group(true, options), options);
    const size_t units = fsdp_units(*model).size();
    ASSERT_EQ(units, 3u);
    model->forward(torch::randn({4, 7})).sum().backward();  // lazy initialization, untraced
    profiler::start();
    at::Tensor loss = model->forward(torch::randn({4, 7})).sum();
    {
      profiler::record_function backward("backward");
      loss.backward();
    }
    profiler::stop();
    const std::string path = ctx.temp_dir + "/rank-" + std::to_string(ctx.rank) + ".json";
    profiler::export_chrome_trace(path);
    const Trace trace(path);

    auto ends_with = [](const std::string& s, const std::string& suffix) {
      return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    std::vector<json> post_backward = trace.named("FSDP::post_backward ");
    std::sort(post_backward.begin(), post_backward.end(),
              [](const json& a, const json& b) { return a.at("ts").get<long long>() < b.at("ts").get<long long>(); });
    ASSERT_EQ(post_backward.size(), units);
    std::vector<json> issued;
    for (const auto& e : trace.named("issue all_reduce #"))
      if (ends_with(e.at("name"), " " + replicate)) issued.push_back(e);
    ASSERT_EQ(issued.size(), units) << "one replicate all-reduce per unit";
    for (const auto& issue : issued) {
      SCOPED_TRACE(issue.dump());
      const std::string in = issue.at("args").at("in");
      EXPECT_EQ(in.rfind("FSDP::post_backward ", 0), 0u) << "issued in " << in << ", not in the unit's post-backward";
      size_t k = 0;
      while (k < post_backward.size() && post_backward[k].at("name") != in) ++k;
      ASSERT_LT(k, post_backward.size());
      const json& span = post_backward[k];
      EXPECT_LE(span.at("ts").get<long long>(), issue.at("ts").get<long long>());
      EXPECT_LE(issue.at("ts").get<long long>(), end_of(span));
      // Before the backward compute of the units after it.
      if (k + 1 < post_backward.size()) {
        EXPECT_LE(issue.at("ts").get<long long>(), post_backward[k + 1].at("ts").get<long long>());
      }
      // After its unit's reduce-scatter, which the comm thread waits for before running it.
      std::string reduce_scatter;
      for (const auto& e : trace.named("issue reduce_scatter_tensor #"))
        if (e.at("args").at("in") == in) {
          EXPECT_LE(e.at("ts").get<long long>(), issue.at("ts").get<long long>());
          reduce_scatter = e.at("name").get<std::string>().substr(std::string("issue ").size());
        }
      ASSERT_FALSE(reduce_scatter.empty());
      const std::string all_reduce = issue.at("name").get<std::string>().substr(std::string("issue ").size());
      std::vector<json> runs;
      for (const auto& e : trace.named(all_reduce))
        if (e.at("name") == all_reduce) runs.push_back(e);
      ASSERT_EQ(runs.size(), 1u) << all_reduce;
      const json& run = runs.front();
      EXPECT_EQ(trace.track_names.at(run.at("tid").get<int>()), "comm thread of group " + replicate);
      bool waited = false;
      for (const auto& wait : trace.named("wait " + reduce_scatter))
        if (wait.at("name") == "wait " + reduce_scatter && wait.at("tid") == run.at("tid")) {
          waited = true;
          EXPECT_LE(end_of(wait), run.at("ts").get<long long>());
        }
      EXPECT_TRUE(waited) << "the replicate comm thread waits for " << reduce_scatter;
    }
  });
}

TEST(ProfilerErrors, ExportNamesTheFileItCannotWrite) {
  const std::string error = testing::error_of([] { profiler::export_chrome_trace("/nonexistent-dir/trace.json"); });
  EXPECT_NE(error.find("'/nonexistent-dir/trace.json'"), std::string::npos) << error;
}

}  // namespace
}  // namespace fsdpp

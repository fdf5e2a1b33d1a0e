// A memory limit inside FSDP: the all-gather that does not fit throws c10::OutOfMemoryError
// naming the unit and the bytes, on every rank alike, and the ranks report it and exit cleanly.
#include <fsdpp/memory.h>
#include <fsdpp/wrap_policy.h>

#include "dist/fsdp_test_util.h"

namespace fsdpp {
namespace {

TEST(MemoryLimitFsdp, GatherPastTheLimitNamesTheUnit) {
  run_ranks(2, [](RankContext&) {
    torch::manual_seed(0);
    Sequential net(Linear(64, 64), ReLU(), Linear(64, 64));
    auto model = fully_shard(net, FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<torch::nn::LinearImpl>()));
    at::Tensor x = torch::ones({2, 64});
    empty_cache();
    // Room for the input and half a unit: the first unit's gather (16.6 KB) does not fit.
    set_memory_limit(memory_stats().current_bytes + 8 * 1024);
    std::string what = "no error";
    try {
      model->forward(x);
    } catch (const c10::OutOfMemoryError& e) {
      what = e.what();
    }
    set_memory_limit(0);
    EXPECT_NE(what.find("FSDP unit torch::nn::LinearImpl"), std::string::npos) << what;
    EXPECT_NE(what.find("out of memory under fsdpp's memory limit"), std::string::npos) << what;
    EXPECT_NE(what.find("bytes in use and a limit of"), std::string::npos) << what;
  });
}

// One rank runs out of memory and goes on to its next collective (the harness's final barrier);
// its peer, waiting in an all_reduce that rank never reached, fails with an out-of-memory
// error naming it and its bytes, not with a disagreement about collectives (what made
// TrainUnderMemoryLimit's DDP case depend on which rank ran out first).
TEST(MemoryLimitFsdp, PeerOfARankOutOfMemoryGetsItsError) {
  run_ranks(2, [](RankContext& ctx) {
    if (ctx.rank == 1) {
      set_memory_limit(memory_stats().current_bytes + 1024);
      EXPECT_THROW(at::empty({1 << 20}), c10::OutOfMemoryError);
      set_memory_limit(0);
      return;
    }
    std::string what = "no error";
    try {
      at::Tensor t = at::ones({4});
      all_reduce(t, ReduceOp::SUM);
    } catch (const c10::OutOfMemoryError& e) {
      what = e.what_without_backtrace();
    }
    EXPECT_NE(what.find("rank 1 of world ran out of memory under fsdpp's memory limit (tried to allocate 4194304 bytes"),
              std::string::npos) << what;
    EXPECT_NE(what.find("disagree on a collective: rank 0: all_reduce"), std::string::npos) << what;
  });
}

}  // namespace
}  // namespace fsdpp

// Distributed checkpoint (seed 003, test_fsdp_model_state.py): save under one sharding, load
// under another (world sizes and process-group layouts), replicated tensors written once, plain
// values, and every bad input: killed saves, corrupt files, another model's checkpoint.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/memory.h>
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "checkpoint/checkpoint_test_util.h"
#include "dist/world_sizes.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::error_of;
using testing::RankContext;

// The model everyone checks against: row-sharded tensors (5 rows leaves rank 3 of 4 empty and
// rank 2 of 3 short) and replicated ones.
std::map<std::string, at::Tensor> reference(double shift = 0) {
  at::manual_seed(1234);
  std::map<std::string, at::Tensor> m;
  m["model.0.weight"] = at::randn({10, 3}) + shift;
  m["model.0.bias"] = at::randn({10}, at::kDouble) + shift;
  m["model.1.weight"] = at::randint(0, 1000, {5, 2}, at::kLong) + static_cast<int64_t>(shift);
  m["model.1.bias"] = (at::randn({7}) + shift).to(at::kBFloat16);
  m["buffers.table"] = at::randn({4, 4}) + shift;  // replicated
  m["buffers.scale"] = at::scalar_tensor(3.5 + shift);  // replicated, 0-d
  return m;
}
bool replicated(const std::string& key) { return key.rfind("buffers.", 0) == 0; }

// FSDP's dim-0 chunks: ceil(rows / n) rows per rank, the last ranks possibly short or empty.
std::pair<int64_t, int64_t> rows_of(int64_t rows, int n, int r) {
  const int64_t per = (rows + n - 1) / n;
  const int64_t begin = std::min(rows, r * per);
  return {begin, std::min(rows, begin + per)};
}

// Rank r of n's state: its row shard of each sharded tensor, the replicated ones whole. With
// `fill` the values are the reference's, else NaN/-1 (so a missed element shows).
ckpt::State state_for(const std::map<std::string, at::Tensor>& ref, int n, int r, bool fill) {
  ckpt::State state;
  for (const auto& [key, full] : ref) {
    at::Tensor t;
    if (replicated(key)) {
      t = fill ? full.clone() : at::full_like(full, -1);
      state[key] = t;
      continue;
    }
    auto [b, e] = rows_of(full.size(0), n, r);
    t = fill ? full.slice(0, b, e).clone() : at::full_like(full.slice(0, b, e), -1);
    std::vector<int64_t> offsets(full.dim(), 0);
    offsets[0] = b;
    state[key] = ckpt::Entry::sharded(t, offsets, full.sizes().vec());
  }
  return state;
}

void expect_state(const ckpt::State& state, const std::map<std::string, at::Tensor>& ref, const std::string& where) {
  for (const auto& [key, full] : ref) {
    const auto& e = state.at(key);
    if (e.kind() == ckpt::Entry::Kind::kTensor) {
      EXPECT_TRUE(at::equal(e.tensor(), full)) << key << " " << where;
      continue;
    }
    for (const auto& sh : e.shards()) {
      at::Tensor want = full;
      for (size_t d = 0; d < sh.offsets.size(); ++d)
        want = want.narrow(static_cast<int64_t>(d), sh.offsets[d], sh.tensor.size(static_cast<int64_t>(d)));
      EXPECT_TRUE(at::equal(sh.tensor, want)) << key << " " << where;
    }
  }
}

ProcessGroup first_ranks(const RankContext& ctx, int n) {
  if (n == ctx.world_size) return ctx.world;
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  return ctx.world.new_group(ranks);
}

struct Reshard {
  int save_world, load_world;
};
void PrintTo(const Reshard& p, std::ostream* os) { *os << p.save_world << " -> " << p.load_world << " ranks"; }
class CheckpointReshard : public ::testing::TestWithParam<Reshard> {};

// Saved by the first S ranks, loaded by the first L with their own row chunks.
TEST_P(CheckpointReshard, RowChunks) {
  const auto [S, L] = GetParam();
  testing::run_ranks(std::max(S, L), [S = S, L = L](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ProcessGroup savers = first_ranks(ctx, S);
    if (ctx.rank < S) ckpt::save(state_for(ref, S, ctx.rank, true), dir, ckpt::SaveOptions().process_group(savers));
    barrier(ctx.world);
    if (ctx.rank < L) {
      ckpt::State state = state_for(ref, L, ctx.rank, false);
      ckpt::load(state, dir);
      expect_state(state, ref, "rank " + std::to_string(ctx.rank) + " of " + std::to_string(L));
    }
    barrier(ctx.world);
  });
}
INSTANTIATE_TEST_SUITE_P(, CheckpointReshard,
                         ::testing::Values(Reshard{4, 2}, Reshard{2, 3}, Reshard{3, 1}, Reshard{1, 4}, Reshard{4, 4}),
                         [](const ::testing::TestParamInfo<Reshard>& info) {
                           return "Save" + std::to_string(info.param.save_world) + "Load" +
                                  std::to_string(info.param.load_world);
                         });

// Seed 003's test_fsdp_model_state_with_resharding on sharded state (the FSDP model's state dict
// joins once it exists): saved at world 4, loaded by two process groups of 2, even and odd ranks.
TEST(Checkpoint, ShardedStateWithReshardingIntoTwoGroups) {
  testing::run_ranks(4, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::save(state_for(ref, 4, ctx.rank, true), dir);
    ProcessGroup evens = ctx.world.new_group({0, 2});
    ProcessGroup odds = ctx.world.new_group({1, 3});
    ProcessGroup mine = ctx.rank % 2 ? odds : evens;
    // A different model before loading, as the seed asserts.
    ckpt::State state = state_for(reference(1.0), mine.size(), mine.rank(), true);
    ckpt::State before = state_for(reference(1.0), mine.size(), mine.rank(), true);
    EXPECT_FALSE(at::equal(state.at("buffers.table").tensor(), ref.at("buffers.table")));
    ckpt::load(state, dir);
    expect_state(state, ref, "group " + mine.name() + " rank " + std::to_string(mine.rank()));
    // The groups really are of 2: a sum over mine sees two ranks.
    at::Tensor one = at::ones({1});
    all_reduce(one, ReduceOp::SUM, mine);
    EXPECT_EQ(one.item<float>(), 2.0f);
  });
}

// Dim-0 row chunks saved, loaded as column blocks (any N-d box layout).
TEST(Checkpoint, RowChunksLoadIntoColumnBlocks) {
  testing::run_ranks(3, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::save(state_for(ref, 3, ctx.rank, true), dir);
    const at::Tensor& w = ref.at("model.0.weight");  // [10, 3]
    at::Tensor col = at::zeros({7, 1});               // rows 2..9 of column rank
    ckpt::State state{{"model.0.weight", ckpt::Entry::sharded(col, {2, ctx.rank}, {10, 3})}};
    ckpt::load(state, dir, ckpt::LoadOptions().verify(ctx.rank != 1));  // rank 1 reads only its rows
    EXPECT_TRUE(at::equal(col, w.slice(0, 2, 9).slice(1, ctx.rank, ctx.rank + 1)));
  });
}

TEST(Checkpoint, ReplicatedTensorsWrittenOnce) {
  testing::run_ranks(3, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State state = state_for(ref, 3, ctx.rank, true);
    for (int i = 0; i < 4; ++i) state["buffers.extra" + std::to_string(i)] = at::full({16}, i * 1.0);
    ckpt::save(state, dir);
    if (ctx.rank != 0) return;
    const auto m = ckpt::read_metadata(dir);
    int64_t bytes = 0;
    std::set<std::string> writers;
    for (const auto& [key, e] : m.entries) {
      if (e.kind != ckpt::Entry::Kind::kTensor) continue;
      int64_t chunk_bytes = 0;
      for (const auto& c : e.chunks) chunk_bytes += c.end - c.begin;
      EXPECT_EQ(chunk_bytes, at::empty(e.shape).numel() * (e.dtype == "F64" || e.dtype == "I64" ? 8 : e.dtype == "BF16" ? 2 : 4))
          << key;
      bytes += chunk_bytes;
      if (replicated(key)) {
        EXPECT_EQ(e.chunks.size(), 1u) << key << " written more than once";
        writers.insert(e.chunks[0].file);
      }
    }
    // Replicas spread over the ranks instead of all landing on rank 0.
    EXPECT_GT(writers.size(), 1u);
    int64_t data = 0;
    for (const auto& [f, size] : m.file_sizes) data += fs::file_size(dir + "/" + f), (void)size;
    EXPECT_LT(data, bytes + 3 * 4096) << "data files hold about one copy of everything";
  });
}

TEST(Checkpoint, PlainValuesRoundTrip) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    const std::string rng("\x00\x01\xff\x7f zero\x00inside", 15);
    ckpt::State state{{"step", int64_t{1} << 40}, {"lr", 0.1}, {"tiny", 1e-300}, {"nan", std::nan("")},
                      {"inf", -HUGE_VAL}, {"name", "run \"7\" \xc3\xa9"}, {"rng", ckpt::Entry::bytes(rng)},
                      {"w", at::ones({2})}};
    ckpt::save(state, dir);
    ckpt::State back{{"step", 0}, {"lr", 0.0}, {"tiny", 0.0}, {"nan", 0.0}, {"inf", 0.0}, {"name", ""},
                     {"rng", ckpt::Entry::bytes("")}};
    ckpt::load(back, dir);
    EXPECT_EQ(back["step"].to_int(), int64_t{1} << 40);
    EXPECT_EQ(back["lr"].to_double(), 0.1);
    EXPECT_EQ(back["tiny"].to_double(), 1e-300);
    EXPECT_TRUE(std::isnan(back["nan"].to_double()));
    EXPECT_EQ(back["inf"].to_double(), -HUGE_VAL);
    EXPECT_EQ(back["name"].to_string(), "run \"7\" \xc3\xa9");
    EXPECT_EQ(back["rng"].kind(), ckpt::Entry::Kind::kBytes);
    EXPECT_EQ(back["rng"].to_string(), rng);
    // A value loads only into the same kind.
    ckpt::State wrong{{"step", 0.0}};
    EXPECT_NE(error_of([&] { ckpt::load(wrong, dir); }).find("entry 'step' is a int64 there but a double"),
              std::string::npos);
    EXPECT_EQ(wrong["step"].to_double(), 0.0);
  });
}

// A data loader's position and RNG, as a Stateful object saved beside other state.
class ToyLoader : public ckpt::Stateful {
 public:
  int64_t position = 0;
  std::string rng;
  at::Tensor weights = at::zeros({3});
  ckpt::State state_dict() const override {
    return {{"position", position}, {"rng", ckpt::Entry::bytes(rng)}, {"weights", weights}};
  }
  void load_state_dict(const ckpt::State& state) override {
    position = state.at("position").to_int();
    rng = state.at("rng").to_string();
    weights.copy_(state.at("weights").tensor());
  }
};

TEST(Checkpoint, StatefulObjectsRoundTripBesideOtherState) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    ToyLoader saved;
    saved.position = 41;
    saved.rng = std::string("\x00\xffstate", 7);
    saved.weights = at::arange(3, at::kFloat);
    ckpt::State state = ckpt::to_state(saved, "loader.");
    state["step"] = 9;
    ckpt::save(state, dir);

    ToyLoader fresh;
    ckpt::State back = ckpt::to_state(fresh, "loader.");
    back["step"] = 0;
    ckpt::load(back, dir);
    ckpt::load_stateful(fresh, back, "loader.");
    EXPECT_EQ(fresh.position, 41);
    EXPECT_EQ(fresh.rng, saved.rng);
    EXPECT_TRUE(fresh.weights.equal(saved.weights));
    EXPECT_EQ(back["step"].to_int(), 9);
    EXPECT_NE(error_of([&] { ckpt::load_stateful(fresh, back, "sampler."); }).find("'sampler.'"), std::string::npos);
  });
}

// A reader that knows only the safetensors spec and docs/checkpoint-format.md (Python's
// standard library) assembles the same bytes.
TEST(Checkpoint, DataFilesReadByStdlibPython) {
  testing::run_ranks(3, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State state = state_for(ref, 3, ctx.rank, true);
    state["step"] = 42;
    ckpt::save(state, dir);
    if (ctx.rank != 0) return;
    int status = 0;
    const std::string out = testing::run_command(testing::python() + " " + testing::python_tool() + " checkpoint " + dir, status);
    ASSERT_EQ(status, 0) << out;
    const auto j = nlohmann::json::parse(out);
    for (const auto& [key, full] : ref) EXPECT_EQ(j["tensors"][key]["hex"].get<std::string>(), testing::hex_of(full)) << key;
    EXPECT_EQ(j["values"]["step"].get<int64_t>(), 42);
    for (const auto& f : ckpt::read_metadata(dir).files) {
      testing::run_command(testing::python() + " " + testing::python_tool() + " read " + dir + "/" + f + " >/dev/null", status);
      EXPECT_EQ(status, 0) << f;
    }
  });
}

// Flips one byte inside the first chunk of `key`; returns that chunk's file.
std::string flip_a_byte(const std::string& dir, const std::string& key) {
  const auto m = ckpt::read_metadata(dir);
  const auto& c = m.entries.at(key).chunks.at(0);
  std::fstream f(dir + "/" + c.file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(c.begin + 1);
  char b = 0;
  f.read(&b, 1);
  b = static_cast<char>(b ^ 0x10);
  f.seekp(c.begin + 1);
  f.write(&b, 1);
  return dir + "/" + c.file;
}

TEST(Checkpoint, CorruptDataFilesNameFileAndTensor) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::save(state_for(ref, 2, ctx.rank, true), dir);
    barrier(ctx.world);
    if (ctx.rank != 0) return;
    // Bit flip: load fails naming file and tensor, and nothing in the state changed.
    const std::string flipped = flip_a_byte(dir, "model.0.weight");
    ckpt::State state = state_for(ref, 1, 0, false);
    ckpt::State pristine = state_for(ref, 1, 0, false);
    std::string e = error_of([&] { ckpt::load(state, dir); });
    EXPECT_NE(e.find(flipped + ": checksum mismatch in tensor 'model.0.weight'"), std::string::npos) << e;
    for (const auto& [key, entry] : state) {
      const at::Tensor a = entry.kind() == ckpt::Entry::Kind::kTensor ? entry.tensor() : entry.shards()[0].tensor;
      const at::Tensor b = pristine[key].kind() == ckpt::Entry::Kind::kTensor ? pristine[key].tensor()
                                                                              : pristine[key].shards()[0].tensor;
      EXPECT_TRUE(at::equal(a, b)) << key << " changed by a failed load";
    }
    auto problems = ckpt::verify(dir);
    ASSERT_EQ(problems.size(), 1u);
    EXPECT_NE(problems[0].find("checksum mismatch in tensor 'model.0.weight'"), std::string::npos) << problems[0];
    int status = 0;
    testing::run_command(testing::ckpt_tool() + " verify " + dir + " 2>" + ctx.temp_dir + "/err", status);
    EXPECT_EQ(status, 1);
    std::ifstream err_in(ctx.temp_dir + "/err");
    std::string err((std::istreambuf_iterator<char>(err_in)), {});
    EXPECT_NE(err.find(flipped), std::string::npos) << err;
    EXPECT_NE(err.find("'model.0.weight'"), std::string::npos) << err;
    flip_a_byte(dir, "model.0.weight");  // back as it was
    EXPECT_TRUE(ckpt::verify(dir).empty());
    // Truncated: the last chunk of the last file.
    const auto m = ckpt::read_metadata(dir);
    const std::string last = m.files.back();
    std::string victim;
    for (const auto& [key, en] : m.entries)
      for (const auto& c : en.chunks)
        if (c.file == last && c.end == m.file_sizes.at(last)) victim = key;
    fs::resize_file(dir + "/" + last, m.file_sizes.at(last) - 3);
    e = error_of([&] { ckpt::load(state, dir); });
    EXPECT_NE(e.find(dir + "/" + last + " is truncated: tensor '" + victim + "'"), std::string::npos) << e;
    problems = ckpt::verify(dir);
    ASSERT_FALSE(problems.empty());
    EXPECT_NE(problems[0].find("(truncated)"), std::string::npos) << problems[0];
  });
}

// LoadOptions().in_place(true): the same values, each tensor copied into its destination as
// soon as it is read, so the load's tensor memory beyond the state is one tensor's read buffers
// (its region and the chunk being read: 2 MiB here) instead of every tensor's (4 MiB: three
// regions and a chunk); a failed load then leaves the entries before the failure changed (the
// default changes none: above).
TEST(Checkpoint, InPlaceLoadHoldsOneTensorsReadBuffers) {
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    std::map<std::string, at::Tensor> big{
        {"a", at::randn({1 << 18})}, {"b", at::randn({1 << 18})}, {"c", at::randn({1 << 18})}};  // 1 MiB each
    ckpt::State saved;
    for (const auto& [key, t] : big) saved[key] = t;
    ckpt::save(saved, dir);
    auto unfilled = [&] {
      ckpt::State s;
      for (const auto& [key, t] : big) s[key] = at::full_like(t, -1);
      return s;
    };
    auto load_peak = [&](ckpt::State& s, const ckpt::LoadOptions& options) {
      const int64_t base = memory_stats().current_bytes;
      reset_peak_memory_stats();
      ckpt::load(s, dir, options);
      return memory_stats().peak_bytes - base;
    };
    ckpt::State all_at_once = unfilled(), in_place = unfilled();
    const int64_t peak_all_at_once = load_peak(all_at_once, {});
    const int64_t peak_in_place = load_peak(in_place, ckpt::LoadOptions().in_place(true));
    for (const auto& [key, t] : big) {
      EXPECT_TRUE(at::equal(all_at_once[key].tensor(), t)) << key;
      EXPECT_TRUE(at::equal(in_place[key].tensor(), t)) << key;
    }
    EXPECT_GE(peak_all_at_once, 4 << 20);
    EXPECT_LE(peak_in_place, 2 << 20);
    flip_a_byte(dir, "c");
    ckpt::State partial = unfilled();
    const std::string e = error_of([&] { ckpt::load(partial, dir, ckpt::LoadOptions().in_place(true)); });
    EXPECT_NE(e.find("checksum mismatch in tensor 'c'"), std::string::npos) << e;
    EXPECT_TRUE(at::equal(partial["a"].tensor(), big["a"]));  // filled before 'c' failed
    EXPECT_TRUE(at::equal(partial["c"].tensor(), at::full_like(big["c"], -1)));
  });
}

TEST(Checkpoint, MetadataFromAnotherModel) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::save(state_for(ref, 2, ctx.rank, true), dir);
    // Keys are loaded in order; the bad one sorts last so the good ones were read first.
    auto attempt = [&](const std::string& key, at::Tensor t) {
      ckpt::State state = state_for(ref, 2, ctx.rank, false);
      state[key] = t;
      const at::Tensor before = state.at("model.0.bias").shards()[0].tensor.clone();
      const std::string e = error_of([&] { ckpt::load(state, dir); });
      EXPECT_TRUE(at::equal(state.at("model.0.bias").shards()[0].tensor, before)) << "a failed load changed the state";
      EXPECT_TRUE(at::equal(state.at("buffers.table").tensor(), at::full({4, 4}, -1.0)));
      return e;
    };
    std::string e = attempt("zz.missing", at::zeros({2}));
    EXPECT_NE(e.find("checkpoint " + dir + " has no entry 'zz.missing'"), std::string::npos) << e;
    e = attempt("model.1.weight", at::zeros({6, 2}, at::kLong));
    EXPECT_NE(e.find("tensor 'model.1.weight' is I64 [5, 2] there but I64 [6, 2]"), std::string::npos) << e;
    e = attempt("model.1.weight", at::zeros({5, 2}, at::kInt));
    EXPECT_NE(e.find("tensor 'model.1.weight' is I64 [5, 2] there but I32 [5, 2]"), std::string::npos) << e;
  });
}

TEST(Checkpoint, NotACheckpointDirectory) {
  testing::run_ranks(1, [](RankContext& ctx) {
    ckpt::State state{{"w", at::zeros({3})}};
    const std::string d = ctx.temp_dir;
    EXPECT_NE(error_of([&] { ckpt::load(state, d + "/nope"); }).find(d + "/nope does not exist"), std::string::npos);
    fs::create_directory(d + "/empty");
    EXPECT_NE(error_of([&] { ckpt::load(state, d + "/empty"); }).find(d + "/empty is not an fsdpp checkpoint"),
              std::string::npos);
    std::ofstream(d + "/file") << "x";
    EXPECT_NE(error_of([&] { ckpt::load(state, d + "/file"); }).find("it is not a directory"), std::string::npos);
    fs::create_directory(d + "/garbage");
    std::ofstream(d + "/garbage/metadata.json") << "{\"format\": \"something else\"}";
    EXPECT_NE(error_of([&] { ckpt::load(state, d + "/garbage"); })
                  .find(d + "/garbage/metadata.json is not valid checkpoint metadata"),
              std::string::npos);
    // save never replaces a directory that is not a checkpoint.
    fs::create_directory(d + "/mine");
    std::ofstream(d + "/mine/precious.txt") << "keep";
    EXPECT_NE(error_of([&] { ckpt::save(state, d + "/mine"); }).find("is not an fsdpp checkpoint; refusing to replace it"),
              std::string::npos);
    EXPECT_TRUE(fs::exists(d + "/mine/precious.txt"));
    EXPECT_TRUE(at::equal(state["w"].tensor(), at::zeros({3})));
  });
}

// A write error (here: the file-size limit, as a full disk would) on one rank: every rank
// throws naming that rank's file, and the previous checkpoint at the same path stays loadable.
TEST(Checkpoint, WriteErrorKeepsPreviousCheckpoint) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State small{{"w", ckpt::Entry::sharded(at::full({4, 4}, ctx.rank + 1.0), {4 * ctx.rank, 0}, {8, 4})}};
    ckpt::save(small, dir);
    if (ctx.rank == 1) {
      ::signal(SIGXFSZ, SIG_IGN);
      rlimit limit{8192, 8192};
      ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
    }
    ckpt::State big{{"w", ckpt::Entry::sharded(at::full({4, 4}, 9.0), {4 * ctx.rank, 0}, {8, 4})},
                    {"big" + std::to_string(ctx.rank), at::ones({64, 64})}};
    const std::string e = error_of([&] { ckpt::save(big, dir); });
    EXPECT_NE(e.find("rank 1: writing tensor"), std::string::npos) << e;
    EXPECT_NE(e.find("rank-00001.safetensors failed: File too large"), std::string::npos) << e;
    EXPECT_NE(e.find("the previous checkpoint there, if any, is untouched"), std::string::npos) << e;
    at::Tensor w = at::zeros({8, 4});
    ckpt::State back{{"w", w}};
    ckpt::load(back, dir);
    EXPECT_TRUE(at::equal(w, at::cat({at::full({4, 4}, 1.0), at::full({4, 4}, 2.0)})));
    barrier(ctx.world);
    if (ctx.rank == 0) {
      for (const auto& d : fs::directory_iterator(ctx.temp_dir))
        EXPECT_EQ(d.path().filename().string().find("ckpt.tmp-"), std::string::npos) << "staging left behind";
    }
  });
}

// Inconsistent shards across ranks are caught on every rank, naming ranks, before any write.
TEST(Checkpoint, InconsistentShardsAcrossRanks) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State overlap{{"w", ckpt::Entry::sharded(at::ones({3, 2}), {ctx.rank * 2, 0}, {5, 2})}};
    std::string e = error_of([&] { ckpt::save(overlap, dir); });
    EXPECT_NE(e.find("shards of tensor 'w' overlap"), std::string::npos) << e;
    ckpt::State gap{{"w", ckpt::Entry::sharded(at::ones({2, 2}), {ctx.rank * 3, 0}, {5, 2})}};
    e = error_of([&] { ckpt::save(gap, dir); });
    EXPECT_NE(e.find("cover 8 of the 10 elements"), std::string::npos) << e;
    ckpt::State dtype{{"w", at::ones({2}, ctx.rank ? at::kDouble : at::kFloat)}};
    e = error_of([&] { ckpt::save(dtype, dir); });
    EXPECT_NE(e.find("tensor 'w' is F32 [2] on rank 0 but F64 [2] on rank 1"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(dir));
  });
}

// async_save: the checkpoint holds the values at the call even though training changes them
// right after; a second save waits for the first.
TEST(Checkpoint, AsyncSave) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const auto ref = reference();
    ckpt::State state = state_for(ref, 2, ctx.rank, true);
    state["step"] = 1;
    ckpt::SaveHandle first = ckpt::async_save(state, ctx.temp_dir + "/a");
    // "Training" goes on: in place updates and collectives on the world group.
    for (auto& [key, e] : state) {
      if (e.kind() == ckpt::Entry::Kind::kTensor) e.tensor().fill_(7);
      if (e.kind() == ckpt::Entry::Kind::kSharded) e.shards()[0].tensor.fill_(7);
    }
    at::Tensor t = at::ones({8});
    for (int i = 0; i < 5; ++i) all_reduce(t, ReduceOp::SUM, ctx.world);
    state["step"] = 2;
    ckpt::SaveHandle second = ckpt::async_save(state, ctx.temp_dir + "/b");  // waits for the first
    EXPECT_TRUE(first.done());
    second.wait();
    first.wait();
    ckpt::State a = state_for(ref, 2, ctx.rank, false);
    a["step"] = 0;
    ckpt::load(a, ctx.temp_dir + "/a");
    expect_state(a, ref, "first async save");
    EXPECT_EQ(a["step"].to_int(), 1);
    ckpt::State b = state_for(ref, 2, ctx.rank, false);
    ckpt::load(b, ctx.temp_dir + "/b");
    EXPECT_TRUE(at::equal(b.at("buffers.table").tensor(), at::full({4, 4}, 7.0)));
  });
}

// async_save whose staged copy would not fit the memory limit: it saves synchronously from the
// tensors themselves, under the limit, and the checkpoint is whole. (Staging as usual would
// throw c10::OutOfMemoryError: the copy alone is past the limit.)
TEST(Checkpoint, AsyncSaveThatWouldNotFitSavesSynchronouslyWithoutACopy) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const auto ref = reference();
    ckpt::State state = state_for(ref, 2, ctx.rank, true);
    // A copy large beside the save's own small buffers (its plan, its metadata).
    const at::Tensor big = at::arange(1 << 18, at::kFloat);
    state["big"] = big;
    int64_t tensor_bytes = 0;
    for (const auto& [key, e] : state) {
      if (e.kind() == ckpt::Entry::Kind::kTensor) tensor_bytes += static_cast<int64_t>(e.tensor().nbytes());
      if (e.kind() == ckpt::Entry::Kind::kSharded) tensor_bytes += static_cast<int64_t>(e.shards()[0].tensor.nbytes());
    }
    empty_cache();
    reset_peak_memory_stats();
    set_memory_limit(memory_stats().current_bytes + tensor_bytes / 2);
    std::string error;
    ckpt::SaveHandle handle;
    try {
      handle = ckpt::async_save(state, ctx.temp_dir + "/a");
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
    } catch (const std::exception& e) {
      error = e.what();
    }
    const bool done_at_return = handle.done();
    set_memory_limit(0);
    ASSERT_EQ(error, "");
    EXPECT_TRUE(done_at_return) << "a save that does not fit beside training is not left running";
    handle.wait();
    ckpt::State loaded = state_for(ref, 2, ctx.rank, false);
    loaded["big"] = at::zeros({1 << 18});
    ckpt::load(loaded, ctx.temp_dir + "/a");
    expect_state(loaded, ref, "async save past the limit");
    EXPECT_TRUE(at::equal(loaded.at("big").tensor(), big));
  });
}

// SIGKILL between the data files and the metadata: the previous checkpoint at the same path is
// still there and loadable, and what the killed save left is recognisably incomplete.
TEST(Checkpoint, KilledSaveLeavesPreviousCheckpoint) {
  testing::RunOptions options;
  options.init_process_group = false;
  testing::run_ranks(1, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/ckpt", marker = ctx.temp_dir + "/paused";
    // Each save runs in a child process (saving alone: no process group), forked before this
    // process has started any threads.
    auto save_in_child = [&](double value, const std::string& where, bool pause) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        if (pause) ::setenv("FSDPP_CHECKPOINT_TEST_PAUSE_BEFORE_METADATA", marker.c_str(), 1);
        try {
          ckpt::save({{"w", at::full({64}, value)}, {"step", static_cast<int64_t>(value)}}, where);
        } catch (...) {
          ::_exit(3);
        }
        ::_exit(0);
      }
      return pid;
    };
    int status = 0;
    ASSERT_EQ(::waitpid(save_in_child(1.0, dir, false), &status, 0) > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, true);
    for (const std::string& target : {dir, ctx.temp_dir + "/fresh"}) {
      fs::remove(marker);
      const pid_t pid = save_in_child(2.0, target, true);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!fs::exists(marker) && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ASSERT_TRUE(fs::exists(marker)) << "the save never reached the pause";
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFSIGNALED(status));
    }
    at::Tensor w = at::zeros({64});
    ckpt::State state{{"w", w}, {"step", 0}};
    ckpt::load(state, dir);
    EXPECT_TRUE(at::equal(w, at::full({64}, 1.0)));
    EXPECT_EQ(state["step"].to_int(), 1);
    EXPECT_TRUE(ckpt::verify(dir).empty());
    // The killed saves' staging directories: data files, no metadata.
    int staged = 0;
    for (const auto& d : fs::directory_iterator(ctx.temp_dir)) {
      const std::string name = d.path().filename().string();
      if (name.find(".tmp-") == std::string::npos) continue;
      ++staged;
      EXPECT_TRUE(fs::exists(d.path() / "rank-00000.safetensors")) << name;
      EXPECT_NE(error_of([&] { ckpt::load(state, d.path().string()); }).find("is an incomplete checkpoint"),
                std::string::npos);
    }
    EXPECT_EQ(staged, 2);
    const std::string e = error_of([&] { ckpt::load(state, ctx.temp_dir + "/fresh"); });
    EXPECT_NE(e.find("/fresh does not exist (" + ctx.temp_dir + "/fresh.tmp-"), std::string::npos) << e;
    EXPECT_NE(e.find("is what an unfinished save left"), std::string::npos) << e;
    EXPECT_TRUE(at::equal(w, at::full({64}, 1.0)));
    // Saving again over the same path works and replaces the old checkpoint.
    ASSERT_EQ(::waitpid(save_in_child(3.0, dir, false), &status, 0) > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, true);
    ckpt::load(state, dir);
    EXPECT_TRUE(at::equal(w, at::full({64}, 3.0)));
  }, options);
}

// fsdpp-ckpt inspect / verify / consolidate, and the consolidated file loaded back sharded.
TEST(Checkpoint, FsdppCkptTool) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const auto ref = reference();
    const std::string dir = ctx.temp_dir + "/ckpt";
    ckpt::State state = state_for(ref, 2, ctx.rank, true);
    state["step"] = 7;
    ckpt::save(state, dir);
    if (ctx.rank != 0) return;
    int status = 0;
    const std::string shown = testing::run_command(testing::ckpt_tool() + " inspect " + dir, status);
    EXPECT_EQ(status, 0) << shown;
    EXPECT_NE(shown.find("model.0.weight  F32 [10, 3]  120 bytes in 2 chunk(s)"), std::string::npos) << shown;
    EXPECT_NE(shown.find("offsets [5, 0] sizes [5, 3]  rank-00001.safetensors"), std::string::npos) << shown;
    EXPECT_NE(shown.find("step  int64  7"), std::string::npos) << shown;
    EXPECT_EQ(shown, ckpt::inspect(dir));
    testing::run_command(testing::ckpt_tool() + " verify " + dir, status);
    EXPECT_EQ(status, 0);
    const std::string out = ctx.temp_dir + "/model.safetensors";
    testing::run_command(testing::ckpt_tool() + " consolidate " + dir + " " + out, status);
    ASSERT_EQ(status, 0);
    const auto whole = ckpt::load_safetensors(out);
    for (const auto& [key, full] : ref) EXPECT_TRUE(at::equal(whole.at(key), full)) << key;
    const std::string py = testing::run_command(testing::python() + " " + testing::python_tool() + " read " + out, status);
    ASSERT_EQ(status, 0);
    const auto j = nlohmann::json::parse(py);
    for (const auto& [key, full] : ref) EXPECT_EQ(j[key]["hex"].get<std::string>(), testing::hex_of(full)) << key;
    // The reverse: the single file into 3 ranks' row shards.
    for (int r = 0; r < 3; ++r) {
      ckpt::State mine = state_for(ref, 3, r, false);
      ckpt::load_safetensors(mine, out);
      expect_state(mine, ref, "rank " + std::to_string(r) + " of 3 from the consolidated file");
    }
    testing::run_command(testing::ckpt_tool() + " inspect " + ctx.temp_dir + " 2>/dev/null", status);
    EXPECT_EQ(status, 1);
    testing::run_command(testing::ckpt_tool() + " frobnicate " + dir + " 2>/dev/null", status);
    EXPECT_EQ(status, 2);
    // A data file gone: verify names it, load names it.
    fs::remove(dir + "/rank-00001.safetensors");
    const std::string err =
        testing::run_command(testing::ckpt_tool() + " verify " + dir + " 2>&1", status);
    EXPECT_EQ(status, 1);
    EXPECT_NE(err.find("cannot open " + dir + "/rank-00001.safetensors"), std::string::npos) << err;
    ckpt::State again = state_for(ref, 1, 0, false);
    EXPECT_NE(error_of([&] { ckpt::load(again, dir); }).find("cannot open " + dir + "/rank-00001.safetensors"),
              std::string::npos);
  });
}

}  // namespace
}  // namespace fsdpp

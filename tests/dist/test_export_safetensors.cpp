// Issue 14's streamed full export: checkpoint::export_safetensors writes a live model's full state
// dict to one safetensors file (rank 0 writes, one tensor gathered at a time). The file must hold
// exactly get_model_state_dict(model, full_state_dict)'s keys, dtypes and values, bitwise, from
// FSDP (world sizes 1-4, so 3 pads), HSDP 2x2, DDP and plain models and from a SHARDED state
// dict; rank 0's memory peak above its state stays one tensor; failures leave no file behind,
// keep a file already there, and throw on every rank.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/memory.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/wrap_policy.h>

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/small_file_system.h"
#include "dist/world_sizes.h"
#include "harness/multi_process.h"
#include "transformer.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::RankContext;

// The example transformer (tied output projection; a vocabulary of 63 rows, odd at every world
// size) beside an odd-shaped parameter and two buffers, one of them int64.
struct ExportNetImpl : torch::nn::Module {
  ExportNetImpl() {
    examples::TransformerArgs args;
    args.vocab_size = 63;
    args.weight_tying = true;
    transformer = register_module("transformer", examples::Transformer(args));
    odd = register_parameter("odd", torch::randn({5, 3}));
    counts = register_buffer("counts", torch::arange(7, at::kLong) * 3);
    scale = register_buffer("scale", torch::rand({3}));
  }
  at::Tensor forward(at::Tensor tokens) { return transformer->forward(tokens) + odd.sum() * scale.sum(); }
  examples::Transformer transformer{nullptr};
  at::Tensor odd, counts, scale;
};
TORCH_MODULE(ExportNet);
using FSDPExportNet = FullyShardedDataParallel<ExportNetImpl>;

FullyShardOptions per_block(FullyShardOptions options = {}) {
  return options.auto_wrap_policy(ModuleWrapPolicy<examples::TransformerBlockImpl>());
}

// One SGD step, so the exported values are trained ones (the same on every rank: same batch).
template <typename Model>
void train_one_step(Model& model) {
  torch::optim::SGD opt(model->parameters(), 0.1);
  torch::manual_seed(42);
  at::Tensor tokens = torch::randint(0, 63, {2, 8}, at::kLong);
  examples::language_model_loss(model->forward(tokens), tokens).backward();
  opt.step();
}

// The file holds exactly `expected`'s keys, dtypes, shapes and bytes.
void expect_file_equals(const std::string& file, const StateDict& expected, const std::string& what) {
  const auto loaded = ckpt::load_safetensors(file);
  EXPECT_EQ(loaded.size(), expected.size()) << what;
  for (const auto& [key, value] : expected) {
    auto it = loaded.find(key);
    ASSERT_NE(it, loaded.end()) << what << ": '" << key << "' is missing";
    const at::Tensor& want = value.tensor();
    EXPECT_EQ(it->second.scalar_type(), want.scalar_type()) << what << ": " << key;
    EXPECT_EQ(it->second.sizes(), want.sizes()) << what << ": " << key;
    EXPECT_TRUE(at::equal(it->second, want)) << what << ": " << key << " differs";
  }
}

StateDict full_state_dict(torch::nn::Module& model) {
  return get_model_state_dict(model, StateDictOptions().full_state_dict(true));
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// Where a rank of the memory test leaves its line for the test process `test_pid` to print.
std::string memory_report(int test_pid, int rank) {
  return "/tmp/fsdpp-export-memory-" + std::to_string(test_pid) + "-rank" + std::to_string(rank) + ".txt";
}

class ExportSafetensors : public testing::WorldSizeTest {};

// An auto-wrapped FSDP model (a unit per block and the root) after a training step: the
// Module and ModuleHolder overloads, and the StateDict overload on its SHARDED state dict.
TEST_P(ExportSafetensors, FsdpModelEqualsFullStateDict) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    torch::manual_seed(0);
    auto model = fully_shard(ExportNet(), per_block());
    train_one_step(model);
    const StateDict full = full_state_dict(*model.ptr());
    const std::string dir = ctx.temp_dir + "/out";
    if (ctx.rank == 0) fs::create_directories(dir);
    barrier(ctx.world);
    ckpt::export_safetensors(model, dir + "/model.safetensors", {{"step", "1"}});
    ckpt::export_safetensors(*model.ptr(), dir + "/module.safetensors");
    const StateDict sharded = get_model_state_dict(model);
    ASSERT_TRUE(sharded.at("transformer.tok_embeddings.weight").is_sharded());
    ckpt::export_safetensors(sharded, dir + "/sharded.safetensors");
    // A FULL dict only rank 0 holds (rank0_only + offload): the others pass their empty dict.
    ckpt::export_safetensors(get_model_state_dict(model, StateDictOptions().full_state_dict(true).cpu_offload(true)),
                             dir + "/rank0.safetensors");
    if (ctx.rank == 0) {
      ASSERT_EQ(full.at("counts").dtype(), at::kLong);
      ASSERT_NE(full.find("transformer.output.weight"), nullptr) << "the tied weight under both names";
      for (const char* name : {"model", "module", "sharded", "rank0"})
        expect_file_equals(dir + "/" + name + ".safetensors", full, name);
      EXPECT_EQ(files_in(dir), (std::vector<std::string>{"model.safetensors", "module.safetensors", "rank0.safetensors",
                                                         "sharded.safetensors"}))
          << "no temporary file is left";
    } else {
      EXPECT_FALSE(fs::exists(dir + "/model.safetensors.tmp-" + std::to_string(::getpid())));
    }
    barrier(ctx.world);
  });
}
FSDPP_INSTANTIATE_WORLD_SIZES(ExportSafetensors);

// HSDP on a 2 x 2 mesh: rank 0's shard group gathers, the other replica sends nothing.
TEST(ExportSafetensors4Ranks, HsdpModel2x2) {
  testing::run_ranks(4, [](RankContext& ctx) {
    torch::manual_seed(0);
    const auto mesh = init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"});
    auto model = fully_shard(ExportNet(), per_block(FullyShardOptions().mesh(mesh)));
    train_one_step(model);
    const StateDict full = full_state_dict(*model.ptr());
    const std::string file = ctx.temp_dir + "/hsdp.safetensors";
    ckpt::export_safetensors(model, file);
    if (ctx.rank == 0) expect_file_equals(file, full, "HSDP 2x2");
    barrier(ctx.world);
  });
}

// DDP (whole tensors on every rank, written by rank 0 alone) and a plain model in one process.
TEST(ExportSafetensors2Ranks, DdpModel) {
  testing::run_ranks(2, [](RankContext& ctx) {
    torch::manual_seed(ctx.rank);  // DDP makes every rank's values rank 0's
    ExportNet net;
    DistributedDataParallel<ExportNetImpl> ddp(net);
    const std::string file = ctx.temp_dir + "/ddp.safetensors";
    ckpt::export_safetensors(net, file);
    if (ctx.rank == 0) expect_file_equals(file, full_state_dict(*net.ptr()), "DDP");
    barrier(ctx.world);
  });
}

// An ignored parameter stays whole on every rank; rank 0's value is written.
TEST(ExportSafetensors2Ranks, IgnoredParameter) {
  testing::run_ranks(2, [](RankContext& ctx) {
    torch::manual_seed(0);
    ExportNet net;
    auto model = fully_shard(net, per_block().ignored_params({net->odd}));
    const StateDict sharded = get_model_state_dict(model);
    ASSERT_TRUE(sharded.at("odd").is_tensor()) << "ignored: whole";
    ASSERT_TRUE(sharded.at("transformer.norm.weight").is_sharded());
    const StateDict full = full_state_dict(*model.ptr());
    const std::string file = ctx.temp_dir + "/ignored.safetensors";
    ckpt::export_safetensors(model, file);
    if (ctx.rank == 0) expect_file_equals(file, full, "ignored parameter");
    barrier(ctx.world);
  });
}

TEST(ExportSafetensors1Rank, PlainModelWithoutProcessGroup) {
  testing::RunOptions options;
  options.init_process_group = false;
  testing::run_ranks(1, [](RankContext& ctx) {
    torch::manual_seed(0);
    ExportNet net;
    const std::string file = ctx.temp_dir + "/plain.safetensors";
    ckpt::export_safetensors(net, file, {{"format", "pt"}, {"note", "plain"}});
    expect_file_equals(file, full_state_dict(*net.ptr()), "plain");
  }, options);
}

// dtypes through the gather: a bf16 and an int64 ShardedTensor of uneven rows (7 over the
// group), a bf16 parameter kept bf16 by mixed precision's param_dtype (parameters stay in their
// own dtype; only compute is cast).
TEST_P(ExportSafetensors, DtypesOfShardedEntries) {
  testing::run_ranks(GetParam(), [](RankContext& ctx) {
    const int n = ctx.world_size, r = ctx.rank;
    torch::manual_seed(3);
    const at::Tensor bf16 = torch::randn({7, 5}).to(at::kBFloat16), longs = torch::arange(14, at::kLong).view({7, 2});
    auto rows_of = [&](const at::Tensor& t) {
      const int64_t chunk = (7 + n - 1) / n, start = std::min<int64_t>(7, r * chunk);
      return t.narrow(0, start, std::min<int64_t>(chunk, 7 - start)).clone();
    };
    auto sharded = [&](const at::Tensor& t) {
      const int64_t chunk = (7 + n - 1) / n, start = std::min<int64_t>(7, r * chunk);
      std::vector<Shard> shards;
      at::Tensor mine = rows_of(t);
      if (mine.size(0) > 0) shards.push_back(Shard::from_tensor_and_offsets(mine, {start, 0}, r));
      return ShardedTensor::from_local_shards(shards, t.sizes().vec(), ctx.world);
    };
    StateDict sd;
    sd.insert("bf16", sharded(bf16));
    sd.insert("whole", torch::ones({2, 2}, at::kDouble));
    sd.insert("longs", sharded(longs));
    const std::string file = ctx.temp_dir + "/dtypes.safetensors";
    ckpt::export_safetensors(sd, file);

    torch::manual_seed(0);
    auto model = fully_shard(ExportNet(), per_block(FullyShardOptions().mp_policy(
                                              MixedPrecisionPolicy().param_dtype(at::kBFloat16))));
    train_one_step(model);
    const StateDict full = full_state_dict(*model.ptr());
    const std::string mp_file = ctx.temp_dir + "/mp.safetensors";
    ckpt::export_safetensors(model, mp_file);
    if (r == 0) {
      StateDict expected;
      expected.insert("bf16", bf16);
      expected.insert("whole", torch::ones({2, 2}, at::kDouble));
      expected.insert("longs", longs);
      expect_file_equals(file, expected, "dtypes");
      EXPECT_EQ(full.at("odd").dtype(), at::kFloat) << "mixed precision keeps the parameters' own dtype";
      expect_file_equals(mp_file, full, "mixed precision");
    }
    barrier(ctx.world);
  });
}

// Memory: 12 blocks and the embeddings (full size >= 10 x the largest unit). Rank 0's peak above
// what it held before the export must stay within 1.1 x the largest tensor (the export gathers
// one tensor at a time; a unit is larger still), far below the full model.
TEST(ExportSafetensors2Ranks, RankZeroPeakIsOneTensorNotTheModel) {
  testing::run_ranks(2, [](RankContext& ctx) {
    examples::TransformerArgs args;
    args.n_layers = 12;
    args.dim = 128;
    args.vocab_size = 256;
    args.max_seq_len = 32;
    torch::manual_seed(0);
    auto model = fully_shard(examples::Transformer(args),
                             FullyShardOptions().auto_wrap_policy(ModuleWrapPolicy<examples::TransformerBlockImpl>()));
    int64_t full_bytes = 0, largest_tensor = 0, largest_unit = 0;
    for (const auto& m : model->modules()) {
      auto* unit = dynamic_cast<FSDPModule*>(m.get());
      if (!unit) continue;
      int64_t unit_bytes = 0;
      for (const auto& p : unit->sharded_parameters()) {
        const int64_t bytes = p.layout.numel() * p.param.element_size();
        unit_bytes += bytes;
        largest_tensor = std::max(largest_tensor, bytes);
      }
      full_bytes += unit_bytes;
      largest_unit = std::max(largest_unit, unit_bytes);
    }
    ASSERT_GE(full_bytes, 10 * largest_unit) << "the model must be >= 10 x its largest unit";
    const std::string file = ctx.temp_dir + "/big.safetensors";
    barrier(ctx.world);
    const int64_t before = memory_stats().current_bytes;
    reset_peak_memory_stats();
    ckpt::export_safetensors(model, file);
    const MemoryStats after = memory_stats();
    const int64_t peak_above = after.peak_bytes - before;
    // The ranks' output is shown only on failure: each rank leaves its line for the test to print.
    FILE* out = std::fopen(memory_report(::getppid(), ctx.rank).c_str(), "w");
    ASSERT_NE(out, nullptr);
    std::fprintf(out, "[export memory] rank %d: full model %lld B, largest unit %lld B, largest tensor %lld B; "
                "peak above the state before the export %lld B = %.3f x largest tensor, %.3f x largest unit, "
                "%.3f x full model; held after %lld B\n",
                ctx.rank, static_cast<long long>(full_bytes), static_cast<long long>(largest_unit),
                static_cast<long long>(largest_tensor), static_cast<long long>(peak_above),
                static_cast<double>(peak_above) / largest_tensor, static_cast<double>(peak_above) / largest_unit,
                static_cast<double>(peak_above) / full_bytes, static_cast<long long>(after.current_bytes - before));
    std::fclose(out);
    EXPECT_LE(peak_above, static_cast<int64_t>(1.1 * largest_tensor)) << "rank " << ctx.rank;
    EXPECT_LE(after.current_bytes - before, 4096) << "nothing kept after the export";
    const StateDict full = full_state_dict(*model.ptr());  // collective
    if (ctx.rank == 0) expect_file_equals(file, full, "12 blocks");
    barrier(ctx.world);
  });
  for (int r = 0; r < 2; ++r) {
    const std::string report = memory_report(::getpid(), r);
    std::printf("%s", read_file(report).c_str());
    std::remove(report.c_str());
  }
}

// Failures: a path that cannot be created (its directory is a regular file) fails on every
// rank naming the file and rank 0; a state dict rank 0 cannot write (a complex tensor) leaves
// the file already at the path untouched and no temporary file; a good export then replaces it.
TEST(ExportSafetensors2Ranks, ErrorsThrowOnEveryRankAndKeepTheOldFile) {
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string dir = ctx.temp_dir + "/out";
    const std::string not_a_dir = ctx.temp_dir + "/plain-file";
    if (ctx.rank == 0) {
      fs::create_directories(dir);
      std::ofstream(not_a_dir) << "x";
      std::ofstream(dir + "/model.safetensors") << "the previous export";
    }
    barrier(ctx.world);
    torch::manual_seed(0);
    auto model = fully_shard(ExportNet(), per_block());

    const std::string bad = not_a_dir + "/model.safetensors";
    try {
      ckpt::export_safetensors(model, bad);
      ADD_FAILURE() << "rank " << ctx.rank << ": exporting to " << bad << " did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
      EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
    }

    const std::string file = dir + "/model.safetensors";
    StateDict sd = get_model_state_dict(model);
    sd.insert("complex", torch::zeros({2}, at::kComplexFloat));
    try {
      ckpt::export_safetensors(sd, file);
      ADD_FAILURE() << "rank " << ctx.rank << ": a complex tensor was exported";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file), std::string::npos) << msg;
      EXPECT_NE(msg.find("ComplexFloat"), std::string::npos) << msg;
    }
    barrier(ctx.world);
    if (ctx.rank == 0) {
      EXPECT_EQ(read_file(file), "the previous export");
      EXPECT_EQ(files_in(dir), std::vector<std::string>{"model.safetensors"});
    }
    barrier(ctx.world);

    // A rank whose ShardedTensor disagrees with rank 0's fails the export on every rank.
    StateDict mine = get_model_state_dict(model);
    if (ctx.rank == 1) mine.erase("odd");
    try {
      ckpt::export_safetensors(mine, file);
      ADD_FAILURE() << "rank " << ctx.rank << ": a dict without 'odd' on rank 1 was exported";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 1: its state dict has no 'odd'"), std::string::npos) << e.what();
    }

    ckpt::export_safetensors(model, file);
    const StateDict full = full_state_dict(*model.ptr());  // collective
    if (ctx.rank == 0) {
      expect_file_equals(file, full, "after the failures");
      EXPECT_EQ(files_in(dir), std::vector<std::string>{"model.safetensors"});
    }
    barrier(ctx.world);
  });
}

// A disk that fills up mid-file (a 1 MiB tmpfs; needs root to mount, else skips saying why):
// rank 0 stops writing but keeps gathering, every rank throws naming rank 0, the file and the
// tensor, the temporary file is gone with its space, and the previous export is untouched.
TEST(ExportSafetensorsDiskFull, WriteFailsMidFile) {
  if (!testing::on_small_file_system()) {
    const std::string why = testing::rerun_on_small_file_system(1 << 20);
    if (!why.empty()) GTEST_SKIP() << why;
    return;
  }
  testing::run_ranks(2, [](RankContext& ctx) {
    const std::string root = testing::small_file_system_root(), file = root + "/model.safetensors";
    if (ctx.rank == 0) std::ofstream(file) << "the previous export";
    barrier(ctx.world);
    auto rows = [&](int64_t n_rows, int64_t cols) {
      const int64_t half = n_rows / 2;
      std::vector<Shard> shards{Shard::from_tensor_and_offsets(at::full({half, cols}, ctx.rank + 1.0), {half * ctx.rank, 0}, ctx.rank)};
      return ShardedTensor::from_local_shards(shards, {n_rows, cols}, ctx.world);
    };
    StateDict sd;
    sd.insert("small", rows(8, 4));
    sd.insert("big", rows(512, 1024));  // 2 MiB
    sd.insert("after", rows(8, 4));
    try {
      ckpt::export_safetensors(sd, file);
      ADD_FAILURE() << "rank " << ctx.rank << ": 2 MiB fit on a 1 MiB file system";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("export_safetensors to " + file + " failed: rank 0: writing tensor 'big' to " + file + ".tmp-"),
                std::string::npos) << msg;
      EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    }
    barrier(ctx.world);
    if (ctx.rank == 0) {
      EXPECT_EQ(files_in(root), std::vector<std::string>{"model.safetensors"});
      EXPECT_EQ(read_file(file), "the previous export");
      EXPECT_GT(testing::free_bytes(root), testing::total_bytes(root) - (64 << 10)) << "the space was not given back";
    }
    barrier(ctx.world);
    sd.erase("big");
    ckpt::export_safetensors(sd, file);
    if (ctx.rank == 0) {
      EXPECT_EQ(ckpt::load_safetensors(file).size(), 2u);
    }
    barrier(ctx.world);
  });
}

// Python's safetensors (Hugging Face's) opens an exported file (3 ranks: uneven rows) and finds
// the model's full state dict, dtypes included. It runs on both legs (safetensors
// from PyPI beside PyPI's torch, python3-safetensors in Debian 13).
TEST(CheckpointInterop, PythonSafetensorsReadsExport) {
  int status = 0;
  testing::run_command(testing::python() + " -c 'import safetensors' 2>/dev/null", status);
  ASSERT_EQ(status, 0) << testing::python() << " has no safetensors package (scripts/install-deps.sh installs it)";
  testing::run_ranks(3, [](RankContext& ctx) {
    torch::manual_seed(0);
    auto model = fully_shard(ExportNet(), per_block());
    train_one_step(model);
    const StateDict full = full_state_dict(*model.ptr());
    const std::string file = ctx.temp_dir + "/model.safetensors";
    ckpt::export_safetensors(model, file, {{"step", "1"}});
    if (ctx.rank != 0) return;
    nlohmann::json expected;
    for (const auto& [key, value] : full)
      expected[key] = {{"shape", value.tensor().sizes().vec()},
                       {"dtype", std::string(c10::toString(value.dtype()))},
                       {"hex", testing::hex_of(value.tensor())}};
    std::ofstream(ctx.temp_dir + "/expected.json") << expected.dump();
    const std::string checker =
        (fs::path(testing::python_tool()).parent_path() / "check_export_with_safetensors.py").string();
    int status = 0;
    const std::string out =
        testing::run_command(testing::python() + " " + checker + " " + file + " " + ctx.temp_dir + "/expected.json 2>&1", status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("ok: " + std::to_string(full.size()) + " tensors equal"), std::string::npos) << out;
  });
}

}  // namespace
}  // namespace fsdpp

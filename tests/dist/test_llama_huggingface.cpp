// Issue 48: fsdpp's Llama against transformers' LlamaForCausalLM. tests/models/llama_reference.py
// makes tiny random models (GQA; untied, tied, and Llama 3.1's rope scaling with an explicit
// head_dim) saved by save_pretrained in several shard files, and their logits. fsdpp loads each
// directory into a deferred FSDP model at 1, 2 and 4 ranks (each rank reading its rows), and its
// logits must equal transformers' within 1e-5; fsdpp's export (several shards, an index, bf16
// too) must open in transformers with the same logits; AdamW steps of FSDP at 2 ranks must land
// where PyTorch's steps on the same batches land. The refusals name the key, file and shape.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/deferred_init.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/error.h>
#include <fsdpp/llama.h>
#include <fsdpp/state_dict.h>
#include <fsdpp/tensor_parallel.h>

#include "checkpoint/checkpoint_test_util.h"
#include "harness/error_of.h"
#include "harness/multi_process.h"

namespace fsdpp {
namespace {

namespace ckpt = checkpoint;
namespace fs = std::filesystem;
using testing::RankContext;

// Whether `error` names `part` (and if not, both, in the failure).
::testing::AssertionResult mentions(const std::string& error, const std::string& part) {
  if (error.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the error\n  " << error << "\ndoes not name\n  " << part;
}

std::string reference_script() {
  return (fs::path(__FILE__).parent_path().parent_path() / "models" / "llama_reference.py").string();
}

// transformers is in the primary leg's environment (scripts/install-deps.sh); Debian's 2.6 leg
// has no transformers package, and there only these parity tests skip.
bool transformers_missing(std::string& why) {
  int status = 0;
  testing::run_command(testing::python() + " -c 'import transformers' 2>&1", status);
  if (status == 0) return false;
  const char* leg = std::getenv("FSDPP_LIBTORCH");
  why = testing::python() + " has no transformers package";
  if (!leg || std::string(leg) != "debian") ADD_FAILURE() << why << " (scripts/install-deps.sh installs it)";
  return true;
}

// The reference models, made once per test process.
const std::string& reference_dir() {
  static const std::string dir = [] {
    std::string d = (fs::temp_directory_path() / ("fsdpp-llama-ref-" + std::to_string(::getpid()))).string();
    fs::create_directories(d);
    int status = 0;
    const std::string out =
        testing::run_command(testing::python() + " " + reference_script() + " make " + d + " 2>&1", status);
    if (status != 0) throw Error("llama_reference.py make failed:\n" + out);
    std::atexit([] { std::error_code ec; fs::remove_all(reference_dir(), ec); });
    return d;
  }();
  return dir;
}

at::Tensor tensor_in(const std::string& file, const std::string& key) { return ckpt::load_safetensors(file).at(key); }

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// transformers' logits for directories fsdpp wrote: one Python run, `pairs` of (dir, output file).
void transformers_logits(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::string args;
  for (const auto& [dir, out] : pairs) args += " " + dir + " " + out;
  int status = 0;
  const std::string out = testing::run_command(testing::python() + " " + reference_script() + " logits " +
                                                   reference_dir() + "/inputs.safetensors" + args + " 2>&1",
                                               status);
  ASSERT_EQ(status, 0) << out;
}

// The deferred Llama of `hf`'s config, each decoder layer an FSDP unit, loaded from `hf`.
FullyShardedDataParallel<LlamaForCausalLMImpl> load_sharded(const std::string& hf, ckpt::HuggingFaceLoadReport* report = nullptr) {
  const LlamaConfig config = LlamaConfig::from_file(hf + "/config.json");
  auto model = fully_shard_llama(deferred_init([&] { return LlamaForCausalLM(config); }));
  to_empty(*model);
  const auto r = ckpt::load_huggingface(*model, hf);
  if (report) *report = r;
  return model;
}

// Tensor bytes of a directory's files, and the most one rank should read at `world_size` (each
// tensor's ceil(rows / N) rows; a tied weight once).
std::pair<int64_t, int64_t> directory_bytes(const std::string& hf, int world_size) {
  int64_t total = 0, per_rank = 0;
  for (const auto& f : fs::directory_iterator(hf)) {
    if (f.path().extension() != ".safetensors") continue;
    for (const auto& [key, t] : ckpt::load_safetensors(f.path().string())) {
      const int64_t bytes = t.numel() * t.element_size();
      total += bytes;
      const int64_t rows = t.dim() ? t.size(0) : 1;
      per_rank += (rows + world_size - 1) / world_size * (bytes / std::max<int64_t>(rows, 1));
    }
  }
  return {total, per_rank};
}

// The tests against transformers: the reference directory, its input ids, and the untied case.
class LlamaParity : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (transformers_missing(why)) GTEST_SKIP() << why;
    ref = reference_dir();
    ids = tensor_in(ref + "/inputs.safetensors", "input_ids");
    hf = ref + "/untied/hf";
    expected = tensor_in(ref + "/untied/logits.safetensors", "logits");
  }
  std::string ref, hf;  // hf: the untied case's directory
  at::Tensor ids, expected;
};

TEST_F(LlamaParity, LogitsEqualTransformersAtOneTwoAndFourRanks) {
  for (const std::string which : {"untied", "tied", "llama3"}) {
    const std::string dir = ref + "/" + which + "/hf";
    const at::Tensor reference = tensor_in(ref + "/" + which + "/logits.safetensors", "logits");
    ASSERT_GT(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 4) << "several shard files";
    for (int world_size : {1, 2, 4}) {
      const auto [total, bound] = directory_bytes(dir, world_size);
      testing::run_ranks(world_size, [&](RankContext& ctx) {
        ckpt::HuggingFaceLoadReport report;
        auto model = load_sharded(dir, &report);
        const at::Tensor logits = model->forward(ids);
        EXPECT_LT(max_diff(logits, reference), 1e-5) << which << " at " << world_size << " ranks, rank " << ctx.rank;
        // Each rank reads its rows only: about 1/N of the data, all ranks together all of it once.
        EXPECT_LE(report.bytes_read, bound) << which << " rank " << ctx.rank;
        at::Tensor sum = torch::tensor({report.bytes_read}, at::kLong);
        all_reduce(sum);
        EXPECT_EQ(sum.item<int64_t>(), total) << which << " at " << world_size << " ranks";
        EXPECT_GT(report.files, 1);
      });
    }
  }
}

// HSDP 2 x 2: each replica's shard group reads the whole directory once, each rank half of it.
TEST_F(LlamaParity, HSDPLoadsEachReplicaFromItsOwnRows) {
  const auto [total, bound] = directory_bytes(hf, 2);
  testing::run_ranks(4, [&](RankContext& ctx) {
    const LlamaConfig config = LlamaConfig::from_file(hf + "/config.json");
    const auto options = FullyShardOptions().mesh(init_device_mesh(ctx.world, {2, 2}, {"replicate", "shard"}));
    auto model = fully_shard_llama(deferred_init([&] { return LlamaForCausalLM(config); }), options);
    to_empty(*model);
    const auto report = ckpt::load_huggingface(*model, hf);
    EXPECT_LE(report.bytes_read, bound) << "rank " << ctx.rank;
    at::Tensor sum = torch::tensor({report.bytes_read}, at::kLong);
    all_reduce(sum);
    EXPECT_EQ(sum.item<int64_t>(), 2 * total);
    EXPECT_LT(max_diff(model->forward(ids), expected), 1e-5) << "rank " << ctx.rank;
  });
}

TEST_F(LlamaParity, ExportOpensInTransformersWithTheSameLogits) {
  const std::string out = ref + "/exported";
  constexpr int64_t kMaxShard = 16000;
  testing::run_ranks(2, [&](RankContext& ctx) {
    for (const std::string which : {"tied", "llama3"}) {
      auto model = load_sharded(ref + "/" + which + "/hf");
      const LlamaConfig config = LlamaConfig::from_file(ref + "/" + which + "/hf/config.json");
      ckpt::export_huggingface(*model, out + "/" + which,
                               ckpt::HuggingFaceExportOptions().max_shard_size(kMaxShard).config_json(config.to_json()));
    }
    // bf16 files, loaded back into float32 parameters.
    auto model = load_sharded(ref + "/untied/hf");
    const LlamaConfig config = LlamaConfig::from_file(ref + "/untied/hf/config.json");
    ckpt::export_huggingface(*model, out + "/bf16",
                             ckpt::HuggingFaceExportOptions().max_shard_size(kMaxShard).dtype(at::kBFloat16).config_json(config.to_json("bfloat16")));
    auto from_bf16 = load_sharded(out + "/bf16");
    const at::Tensor logits = from_bf16->forward(ids);
    if (ctx.rank == 0) torch::save(logits, out + "/bf16-fsdpp-logits.pt");
    // The bf16 values are the float32 ones rounded once.
    const StateDict full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
    const StateDict back = get_model_state_dict(*from_bf16, StateDictOptions().full_state_dict(true));
    if (ctx.rank != 0) return;
    for (const auto& [key, v] : full) EXPECT_TRUE(at::equal(back.at(key).tensor(), v.tensor().to(at::kBFloat16).to(at::kFloat))) << key;
  });
  for (const std::string which : {"tied", "llama3", "bf16"}) {
    const std::string dir = out + "/" + which;
    ASSERT_TRUE(fs::exists(dir + "/model.safetensors.index.json")) << dir;
    const auto index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
    std::set<std::string> files;
    for (const auto& [key, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
    EXPECT_GT(files.size(), 2u) << dir;
    EXPECT_FALSE(index["weight_map"].contains("lm_head.weight") && which == "tied") << "a tied weight is written once";
    for (const auto& f : files) {
      int64_t bytes = 0;
      for (const auto& [key, t] : ckpt::load_safetensors(dir + "/" + f)) {
        bytes += t.numel() * t.element_size();
        EXPECT_EQ(t.scalar_type(), which == "bf16" ? at::kBFloat16 : at::kFloat) << dir << "/" << f << " " << key;
      }
      EXPECT_LE(bytes, kMaxShard) << dir << "/" << f;
    }
  }
  transformers_logits({{out + "/tied", out + "/tied-logits.safetensors"},
                       {out + "/llama3", out + "/llama3-logits.safetensors"},
                       {out + "/bf16", out + "/bf16-logits.safetensors"}});
  for (const std::string which : {"tied", "llama3"})
    EXPECT_LT(max_diff(tensor_in(out + "/" + which + "-logits.safetensors", "logits"),
                       tensor_in(ref + "/" + which + "/logits.safetensors", "logits")),
              1e-5)
        << which;
  at::Tensor fsdpp_bf16;
  torch::load(fsdpp_bf16, out + "/bf16-fsdpp-logits.pt");
  EXPECT_LT(max_diff(tensor_in(out + "/bf16-logits.safetensors", "logits"), fsdpp_bf16), 1e-5);
}

TEST_F(LlamaParity, AdamWStepsOfFSDPMatchPyTorchs) {
  const at::Tensor batches = tensor_in(ref + "/batches.safetensors", "batches");
  const auto trained = ckpt::load_safetensors(ref + "/untied/trained.safetensors");
  testing::run_ranks(2, [&](RankContext& ctx) {
    auto model = load_sharded(hf);
    model->train();
    // llama_reference.py's AdamW.
    torch::optim::AdamW opt(model->parameters(),
                            torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
    std::vector<double> losses;
    for (int64_t step = 0; step < batches.size(0); ++step) {
      opt.zero_grad();
      const at::Tensor mine = batches[step].narrow(0, 2 * ctx.rank, 2);
      const at::Tensor logits = model->forward(mine);
      at::Tensor loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, logits.size(-1)}),
                                                              mine.narrow(1, 1, mine.size(1) - 1).reshape({-1}));
      loss.backward();
      opt.step();
      at::Tensor both = loss.detach().clone();
      all_reduce(both);
      losses.push_back(both.item<double>() / 2);
    }
    const at::Tensor expected_losses = trained.at("losses");
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], expected_losses[static_cast<int64_t>(i)].item<double>(), 1e-5) << "step " << i;
    const StateDict full = get_model_state_dict(*model, StateDictOptions().full_state_dict(true));
    if (ctx.rank != 0) return;
    for (const auto& [key, v] : full)
      EXPECT_LT(max_diff(v.tensor(), trained.at(key)), 1e-5) << key;
  });
}

TEST_F(LlamaParity, TensorParallelAndFSDPxTPLoadTheirPartsAndMatch) {
  testing::run_ranks(2, [&](RankContext& ctx) {
    const LlamaConfig config = LlamaConfig::from_file(hf + "/config.json");
    check_llama_tp(config, ctx.world_size);
    auto model = deferred_init([&] { return LlamaForCausalLM(config); });
    parallelize_module(*model, ctx.world, llama_tp_plan(config));
    to_empty(*model);
    ckpt::load_huggingface(*model, hf);
    EXPECT_EQ(model->named_parameters()["model.layers.0.self_attn.q_proj.weight"].size(0),
              config.num_attention_heads * config.attention_head_dim() / 2)
        << "q_proj holds this rank's heads";
    EXPECT_LT(max_diff(model->forward(ids), expected), 1e-5);
  });
  // FSDP x TP on a (dp 2, tp 2) mesh: the TP plan first, then each decoder layer a unit over dp.
  testing::run_ranks(4, [&](RankContext& ctx) {
    const LlamaConfig config = LlamaConfig::from_file(hf + "/config.json");
    const DeviceMesh mesh = init_device_mesh(ctx.world, {2, 2}, {"dp", "tp"});
    auto plain = deferred_init([&] { return LlamaForCausalLM(config); });
    parallelize_module(*plain, mesh["tp"], llama_tp_plan(config));
    auto model = fully_shard_llama(plain, FullyShardOptions().mesh(mesh["dp"]));
    to_empty(*model);
    ckpt::load_huggingface(*model, hf);
    EXPECT_LT(max_diff(model->forward(ids), expected), 1e-5) << "rank " << ctx.rank;
  });
}

// --- refusals (no transformers needed: fsdpp writes the directories) ---

LlamaConfig tiny_config() {
  LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  return c;
}

// A materialized plain Llama written to `dir` in several shard files.
void write_tiny(const LlamaConfig& config, const std::string& dir) {
  auto model = deferred_init([&] { return LlamaForCausalLM(config); });
  materialize_module(*model, MaterializeOptions().param_init_fn(llama_init_fn(config)));
  ckpt::export_huggingface(*model, dir, ckpt::HuggingFaceExportOptions().max_shard_size(4000).config_json(config.to_json()));
}

std::string load_error(const LlamaConfig& config, const std::string& dir) {
  auto model = deferred_init([&] { return LlamaForCausalLM(config); });
  to_empty(*model);
  return testing::error_of([&] { ckpt::load_huggingface(*model, dir); });
}

TEST(LlamaHuggingFace, RefusesWhatDoesNotFitNamingKeyFileAndShape) {
  const std::string dir = (fs::temp_directory_path() / ("fsdpp-llama-refuse-" + std::to_string(::getpid()))).string();
  const LlamaConfig config = tiny_config();
  write_tiny(config, dir);
  // Round trip first: the plain model loads, bitwise.
  {
    auto model = deferred_init([&] { return LlamaForCausalLM(config); });
    to_empty(*model);
    const auto report = ckpt::load_huggingface(*model, dir);
    EXPECT_GT(report.files, 2);
  }
  LlamaConfig wider = config;
  wider.intermediate_size = 32;
  EXPECT_TRUE(mentions(load_error(wider, dir), "'model.layers.0.mlp.down_proj.weight' is F32 [16, 24] in " + dir + "/model-"));
  EXPECT_TRUE(mentions(load_error(wider, dir), "but [16, 32] in the model"));
  LlamaConfig deeper = config;
  deeper.num_hidden_layers = 3;
  EXPECT_TRUE(mentions(load_error(deeper, dir), "the model's 'model.layers.2.input_layernorm.weight' ([16]) is in none of " + dir));
  LlamaConfig shallower = config;
  shallower.num_hidden_layers = 1;
  EXPECT_TRUE(mentions(load_error(shallower, dir), "holds 'model.layers.1."));
  EXPECT_TRUE(mentions(load_error(shallower, dir), "which the model does not have"));
  // A shard file the index names, gone.
  const auto index = nlohmann::json::parse(std::ifstream(dir + "/model.safetensors.index.json"));
  const std::string lost = index["weight_map"]["model.norm.weight"].get<std::string>();
  fs::rename(dir + "/" + lost, dir + "/" + lost + ".away");
  EXPECT_TRUE(mentions(load_error(config, dir), "model.safetensors.index.json names the shard file " + lost));
  EXPECT_TRUE(mentions(load_error(config, dir), "which is absent from " + dir));
  fs::rename(dir + "/" + lost + ".away", dir + "/" + lost);
  // A re-export with one file removes the older shards and index.
  {
    auto model = deferred_init([&] { return LlamaForCausalLM(config); });
    materialize_module(*model, MaterializeOptions().param_init_fn(llama_init_fn(config)));
    ckpt::export_huggingface(*model, dir);
    EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
    EXPECT_FALSE(fs::exists(dir + "/" + lost));
    EXPECT_TRUE(fs::exists(dir + "/model.safetensors"));
    auto again = deferred_init([&] { return LlamaForCausalLM(config); });
    to_empty(*again);
    ckpt::load_huggingface(*again, dir);
    const auto expected = model->named_parameters();
    for (const auto& item : again->named_parameters())
      EXPECT_TRUE(at::equal(item.value(), expected[item.key()])) << item.key();
  }
  // A dtype that differs, with conversion turned off.
  {
    auto model = deferred_init([&] { return LlamaForCausalLM(config); });
    to_empty(*model);
    model->to(at::kDouble);
    EXPECT_TRUE(mentions(testing::error_of([&] {
                        ckpt::load_huggingface(*model, dir, ckpt::HuggingFaceLoadOptions().convert_dtype(false));
                      }), "is F32 [37, 16] there but F64 [37, 16] in the state to load"));
  }
  EXPECT_TRUE(mentions(load_error(config, dir + "/nothing"), "is not a Hugging Face model directory"));
  fs::remove_all(dir);
}

// A tied model's directory may hold the weight under lm_head.weight alone; Llama 2's converted
// checkpoints hold rotary_emb.inv_freq buffers, which transformers recomputes and so does fsdpp.
TEST(LlamaHuggingFace, LoadsTiedWeightsUnderEitherNameAndSkipsRecomputedBuffers) {
  const std::string dir = (fs::temp_directory_path() / ("fsdpp-llama-tied-" + std::to_string(::getpid()))).string();
  LlamaConfig config = tiny_config();
  config.tie_word_embeddings = true;
  auto model = deferred_init([&] { return LlamaForCausalLM(config); });
  materialize_module(*model, MaterializeOptions().param_init_fn(llama_init_fn(config)));
  fs::create_directories(dir);
  std::map<std::string, at::Tensor> tensors;
  for (const auto& item : model->named_parameters())
    if (item.key() != "model.embed_tokens.weight") tensors.emplace(item.key(), item.value().detach());
  tensors.emplace("model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({2}));
  ckpt::save_safetensors(tensors, dir + "/model.safetensors");
  auto loaded = deferred_init([&] { return LlamaForCausalLM(config); });
  to_empty(*loaded);
  EXPECT_EQ(ckpt::load_huggingface(*loaded, dir).tensors, static_cast<int64_t>(tensors.size()) - 1);
  EXPECT_TRUE(at::equal(loaded->model->embed_tokens->weight, model->model->embed_tokens->weight));
  EXPECT_TRUE(loaded->model->embed_tokens->weight.is_same(loaded->named_parameters()["lm_head.weight"]));
  fs::remove_all(dir);
}

TEST(LlamaConfig, ReadsTransformers4And5ConfigsAndRefusesWhatItCannotExpress) {
  const LlamaConfig v5 = LlamaConfig::from_json(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, "tie_word_embeddings": true, "dtype": "bfloat16"})");
  EXPECT_EQ(v5.rope_theta, 500000.0);
  ASSERT_TRUE(v5.rope_scaling.has_value());
  EXPECT_EQ(v5.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(v5.attention_head_dim(), 8);
  EXPECT_TRUE(v5.tie_word_embeddings);
  EXPECT_EQ(v5.torch_dtype, "bfloat16");
  // transformers 4: rope_theta at the top, rope_scaling with "type"; to_json round-trips.
  const LlamaConfig v4 = LlamaConfig::from_json(R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 2, "num_attention_heads": 8, "rope_theta": 1000.0, "head_dim": 16,
      "rope_scaling": {"type": "llama3", "factor": 2.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
      "original_max_position_embeddings": 64}})");
  EXPECT_EQ(v4.num_key_value_heads, 8) << "defaults to num_attention_heads";
  EXPECT_EQ(v4.attention_head_dim(), 16);
  const LlamaConfig again = LlamaConfig::from_json(v4.to_json());
  EXPECT_EQ(again.rope_theta, 1000.0);
  EXPECT_EQ(again.rope_scaling->factor, 2.0);
  EXPECT_EQ(again.head_dim, 16);
  EXPECT_TRUE(mentions(testing::error_of([] {
                      LlamaConfig::from_json(R"({"num_attention_heads": 8, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})", "dir/config.json");
                    }), "dir/config.json: rope_scaling has rope type 'yarn', which fsdpp's Llama cannot express"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"model_type": "mistral"})", "c.json"); }), "c.json: model_type is 'mistral'"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"num_attention_heads": 6, "num_key_value_heads": 4})"); }), "num_attention_heads (6) is not a multiple of num_key_value_heads (4)"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"hidden_act": "gelu"})"); }), "hidden_act is 'gelu'"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"vocab_size": "many"})"); }), "'vocab_size' is \"many\", not a number"));
  EXPECT_TRUE(mentions(testing::error_of([] { check_llama_tp(tiny_config(), 4); }), "num_key_value_heads (2) does not divide by the TP degree 4"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"attention_dropout": 0.1})"); }), "attention_dropout is 0.1"));
  EXPECT_TRUE(mentions(testing::error_of([] { LlamaConfig::from_json(R"({"partial_rotary_factor": 0.5})"); }), "partial_rotary_factor is 0.5"));
  // A real Llama 3.1 Instruct config: a list of eos ids and fields fsdpp does not use survive
  // to_json; pretraining_tp and "swish" are the same function as fsdpp's.
  const LlamaConfig instruct = LlamaConfig::from_json(R"({"model_type": "llama", "hidden_act": "swish", "pretraining_tp": 2,
      "eos_token_id": [128001, 128008, 128009], "use_cache": true, "rope_scaling": null})");
  EXPECT_FALSE(instruct.eos_token_id.has_value());
  const auto written = nlohmann::json::parse(instruct.to_json("bfloat16"));
  EXPECT_EQ(written["eos_token_id"], nlohmann::json::array({128001, 128008, 128009}));
  EXPECT_EQ(written["use_cache"], true);
  EXPECT_EQ(written["torch_dtype"], "bfloat16");
}

}  // namespace
}  // namespace fsdpp

// Hugging Face model directories: config.json beside model.safetensors or an index and its
// shard files. In: the directory seen as one checkpoint (every tensor one chunk in its file),
// loaded into the model's own tensors, each rank reading its rows. Out: the streamed export
// split into shard files, then the index and config.json.
#include <cstdio>
#include <filesystem>
#include <regex>

#include <ATen/core/grad_mode.h>
#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>
#include <fsdpp/state_dict_container.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_loader.h"
#include "checkpoint/streamed_export.h"
#include "common/shape_string.h"
#include "memory/allocator_caching.h"

namespace fsdpp::checkpoint {

using namespace detail;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kIndex = "model.safetensors.index.json";
constexpr const char* kSingle = "model.safetensors";

// The directory's tensors as a checkpoint's metadata, each a whole tensor in one chunk; `files`
// receives how many safetensors files it has.
Metadata directory_metadata(const std::string& dir, int64_t& files) {
  const std::string index_path = dir + "/" + kIndex;
  std::map<std::string, std::string> file_of;  // key -> file
  std::set<std::string> names;
  if (fs::exists(index_path)) {
    json index;
    try {
      index = json::parse(read_text_file(index_path));
    } catch (const json::exception& e) {
      throw Error(index_path + " is not JSON: " + e.what());
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      throw Error(index_path + " has no \"weight_map\" object");
    for (const auto& [key, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw Error(index_path + ": the weight_map entry of '" + key + "' is not a file name");
      const std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw Error(index_path + ": the weight_map entry of '" + key + "' is '" + name + "', not a file name in " + dir);
      file_of[key] = name;
      names.insert(name);
    }
    for (const auto& name : names)
      if (!fs::exists(dir + "/" + name))
        throw Error(index_path + " names the shard file " + name + " (holding '" +
                    std::find_if(file_of.begin(), file_of.end(), [&](const auto& kv) { return kv.second == name; })->first +
                    "', ...), which is absent from " + dir);
  } else if (fs::exists(dir + "/" + kSingle)) {
    names.insert(kSingle);
  } else {
    throw Error(dir + " is not a Hugging Face model directory: it holds neither " + kIndex + " nor " + kSingle);
  }
  Metadata m;
  files = static_cast<int64_t>(names.size());
  for (const auto& name : names) {
    File f = File::open_read(dir + "/" + name);
    const SafetensorsHeader header = read_safetensors_header(f);
    for (const auto& [key, rec] : header.tensors) {
      if (!file_of.empty()) {
        auto it = file_of.find(key);
        if (it == file_of.end() || it->second != name) continue;  // the index decides where a key lives
      }
      m.entries[key] = whole_tensor_entry(rec, key, name);
    }
  }
  for (const auto& [key, name] : file_of)
    if (!m.entries.count(key))
      throw Error(dir + "/" + kIndex + " says '" + key + "' is in " + name + ", which has no such tensor");
  return m;
}

// Buffers older checkpoints saved that transformers recomputes and ignores on load (Llama 2's
// converted checkpoints hold model.layers.N.self_attn.rotary_emb.inv_freq).
bool recomputed_buffer(const std::string& key) {
  static const std::string inv_freq = "rotary_emb.inv_freq";
  return key.size() >= inv_freq.size() && key.compare(key.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
}

// An earlier export's files: model.safetensors, model-NNNNN-of-NNNNN.safetensors, the index.
bool export_file_name(const std::string& name) {
  static const std::regex ours(R"(model(-[0-9]{5}-of-[0-9]{5})?\.safetensors|model\.safetensors\.index\.json)");
  return std::regex_match(name, ours);
}

std::string where_is(const Metadata& m, const std::string& dir, const std::string& key) {
  return dir + "/" + m.entries.at(key).chunks.at(0).file;
}

}  // namespace

HuggingFaceLoadReport load_huggingface(torch::nn::Module& model, const std::string& dir,
                                       const HuggingFaceLoadOptions& options) {
  fsdpp::detail::NoCachingScope no_caching;  // the read buffers' sizes do not recur in training
  HuggingFaceLoadReport report;
  const Metadata m = directory_metadata(dir, report.files);
  std::map<std::string, std::string> aliases;  // tied: a later key -> the first
  StateDict sd = shared_state_dict(model, &aliases);
  State state = to_state(sd);  // shares the model's tensors: loaded in place
  // A tied weight is read once: under its first key, or under the later one if the files hold
  // only that.
  for (const auto& [alias, first] : aliases)
    state.erase(!m.entries.count(first) && m.entries.count(alias) ? first : alias);
  for (const auto& [key, entry] : state) {
    auto found = m.entries.find(key);
    if (found == m.entries.end())
      throw Error("load_huggingface: the model's '" + key + "' (" + shape_string(entry.global_shape()) +
                  ") is in none of " + dir + "'s files");
    if (found->second.shape != entry.global_shape())
      throw Error("load_huggingface: '" + key + "' is " + found->second.dtype + " " + shape_string(found->second.shape) +
                  " in " + where_is(m, dir, key) + " but " + shape_string(entry.global_shape()) + " in the model");
  }
  for (const auto& [key, info] : m.entries)
    if (!sd.find(key) && !recomputed_buffer(key))
      throw Error("load_huggingface: " + where_is(m, dir, key) + " holds '" + key + "' (" + info.dtype + " " +
                  shape_string(info.shape) + "), which the model does not have");
  StateReadOptions read;
  read.convert_dtype = options.convert_dtype();
  read.in_place = options.in_place();
  report.bytes_read = load_state_from(state, m, dir, dir, read);
  report.tensors = static_cast<int64_t>(state.size());
  return report;
}

void export_huggingface(torch::nn::Module& model, const std::string& dir, const HuggingFaceExportOptions& options) {
  if (options.max_shard_size() <= 0)
    throw Error("export_huggingface to " + dir + ": max_shard_size is " + std::to_string(options.max_shard_size()) +
                "; it must be positive");
  if (options.dtype() && !at::isFloatingType(*options.dtype()))
    throw Error("export_huggingface to " + dir + ": dtype " + c10::toString(*options.dtype()) +
                " is not a floating dtype (floating tensors are converted to it)");
  std::map<std::string, std::string> aliases;
  const StateDict sd = shared_state_dict(model, &aliases);
  ExportTarget target;
  target.api = "export_huggingface";
  target.where = dir;
  target.max_file_bytes = options.max_shard_size();
  target.dtype = options.dtype();
  for (const auto& [alias, first] : aliases) target.skip.insert(alias);
  target.file_name = [dir](int i, int n) {
    std::error_code failed;
    if (i == 0 && (fs::create_directories(dir, failed), failed))
      throw Error("cannot create the folder " + dir + ": " + failed.message());
    if (n == 1) return dir + "/" + kSingle;
    char name[64];
    std::snprintf(name, sizeof name, "/model-%05d-of-%05d.safetensors", i + 1, n);
    return dir + name;
  };
  const std::string config = options.config_json();
  // Once the new files are complete, an earlier export's index and files that the new ones do
  // not replace go first: a failure from here on leaves a directory that refuses to load (no
  // index, or only the new model.safetensors), never old shards mixed with new ones.
  target.before_rename = [dir](const std::vector<std::string>& files) {
    std::set<std::string> kept;
    for (const auto& f : files) kept.insert(fs::path(f).filename().string());
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (export_file_name(name) && !kept.count(name)) fs::remove(entry.path());
    }
  };
  target.after_commit = [dir, config](const ExportedFiles& done) {
    try {
      if (done.files.size() > 1) {
        json index = {{"metadata", {{"total_size", done.total_bytes}}}, {"weight_map", done.file_of}};
        write_file_atomically(dir, kIndex, index.dump(2) + "\n");
      }
      if (!config.empty()) write_file_atomically(dir, "config.json", config);
    } catch (...) {
      std::error_code ignored;
      fs::remove(dir + "/" + kIndex + ".tmp", ignored);
      fs::remove(dir + "/config.json.tmp", ignored);
      throw;
    }
  };
  export_files(sd, target);
}

}  // namespace fsdpp::checkpoint

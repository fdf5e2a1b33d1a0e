// The metadata file of a checkpoint.
#include "checkpoint/metadata.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"

namespace fsdpp::checkpoint::detail {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json double_to_json(double v) {
  // JSON has no NaN or infinity; those are spelled as strings.
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

double double_from_json(const json& j) {
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    throw Error("'" + s + "' is not a double");
  }
  return j.get<double>();
}

}  // namespace

std::string metadata_to_json(const Metadata& m) {
  json j;
  j["format"] = kFormatName;
  j["version"] = kFormatVersion;
  j["world_size"] = m.world_size;
  j["files"] = json::array();
  for (const auto& f : m.files) j["files"].push_back({{"name", f}, {"size", m.file_sizes.at(f)}});
  json entries = json::object();
  for (const auto& [key, e] : m.entries) {
    json je;
    switch (e.kind) {
      case Entry::Kind::kTensor:
      case Entry::Kind::kSharded: {
        je["type"] = "tensor";
        je["dtype"] = e.dtype;
        je["shape"] = e.shape;
        json chunks = json::array();
        for (const auto& c : e.chunks)
          chunks.push_back({{"offsets", c.offsets},
                            {"sizes", c.sizes},
                            {"file", c.file},
                            {"name", c.name},
                            {"byte_range", {c.begin, c.end}},
                            {"xxh3_64", c.xxh3_64}});
        je["chunks"] = std::move(chunks);
        break;
      }
      case Entry::Kind::kInt: je = {{"type", "int64"}, {"value", e.value.to_int()}}; break;
      case Entry::Kind::kDouble: je = {{"type", "double"}, {"value", double_to_json(e.value.to_double())}}; break;
      case Entry::Kind::kString: je = {{"type", "string"}, {"value", e.value.to_string()}}; break;
      case Entry::Kind::kBytes: je = {{"type", "bytes"}, {"hex", to_hex(e.value.to_string())}}; break;
    }
    entries[key] = std::move(je);
  }
  j["entries"] = std::move(entries);
  return j.dump(1) + "\n";
}

Metadata metadata_from_json(const std::string& text, const std::string& where) {
  std::string key;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || j.value("format", "") != kFormatName)
      throw Error("its \"format\" is not \"" + std::string(kFormatName) + "\"");
    const int version = j.at("version").get<int>();
    if (version != kFormatVersion)
      throw Error("format version " + std::to_string(version) + " is not supported (this fsdpp reads version " +
                  std::to_string(kFormatVersion) + ")");
    Metadata m;
    m.world_size = j.at("world_size").get<int>();
    for (const auto& f : j.at("files")) {
      const auto name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw Error("file name '" + name + "' is not a plain file name");
      m.files.push_back(name);
      m.file_sizes[name] = f.at("size").get<int64_t>();
    }
    for (auto it = j.at("entries").begin(); it != j.at("entries").end(); ++it) {
      key = it.key();
      const json& je = *it;
      const auto type = je.at("type").get<std::string>();
      EntryInfo e;
      if (type == "tensor") {
        e.kind = Entry::Kind::kTensor;
        e.dtype = je.at("dtype").get<std::string>();
        dtype_from_name(e.dtype, "dtype");
        e.shape = je.at("shape").get<std::vector<int64_t>>();
        for (const auto& jc : je.at("chunks")) {
          ChunkInfo c;
          c.offsets = jc.at("offsets").get<std::vector<int64_t>>();
          c.sizes = jc.at("sizes").get<std::vector<int64_t>>();
          c.file = jc.at("file").get<std::string>();
          c.name = jc.at("name").get<std::string>();
          const auto range = jc.at("byte_range").get<std::vector<int64_t>>();
          if (range.size() != 2) throw Error("byte_range must have two numbers");
          c.begin = range[0];
          c.end = range[1];
          c.xxh3_64 = jc.value("xxh3_64", "");
          if (c.offsets.size() != e.shape.size() || c.sizes.size() != e.shape.size())
            throw Error("a chunk's offsets/sizes do not match the shape " + shape_string(e.shape));
          for (size_t d = 0; d < e.shape.size(); ++d)
            if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] + c.sizes[d] > e.shape[d])
              throw Error("chunk at offsets " + shape_string(c.offsets) + " sizes " + shape_string(c.sizes) +
                          " lies outside the shape " + shape_string(e.shape));
          if (c.end - c.begin != numel(c.sizes) * element_size(e.dtype) || c.begin < 0)
            throw Error("chunk " + c.name + ": byte_range does not match its sizes and dtype");
          if (!m.file_sizes.count(c.file)) throw Error("chunk " + c.name + " names unknown file '" + c.file + "'");
          e.chunks.push_back(std::move(c));
        }
      } else if (type == "int64") {
        e.kind = Entry::Kind::kInt;
        e.value = Entry(je.at("value").get<int64_t>());
      } else if (type == "double") {
        e.kind = Entry::Kind::kDouble;
        e.value = Entry(double_from_json(je.at("value")));
      } else if (type == "string") {
        e.kind = Entry::Kind::kString;
        e.value = Entry(je.at("value").get<std::string>());
      } else if (type == "bytes") {
        e.kind = Entry::Kind::kBytes;
        e.value = Entry::bytes(from_hex(je.at("hex").get<std::string>(), "hex"));
      } else {
        throw Error("unknown type '" + type + "'");
      }
      m.entries[key] = std::move(e);
    }
    return m;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.rfind("fsdpp: ", 0) == 0) what = what.substr(7);
    throw Error(where + " is not valid checkpoint metadata" + (key.empty() ? "" : " (entry '" + key + "')") + ": " +
                what);
  }
}

std::string why_not_a_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    // A save that died before its final rename leaves DIR.tmp-<id> behind.
    const fs::path p(dir);
    std::string staged;
    for (const auto& d : fs::directory_iterator(p.parent_path().empty() ? "." : p.parent_path(), ec))
      if (d.path().filename().string().rfind(p.filename().string() + ".tmp-", 0) == 0) staged = d.path().string();
    return "checkpoint directory " + dir + " does not exist" +
           (staged.empty() ? "" : " (" + staged + " is what an unfinished save left)");
  }
  if (!fs::is_directory(dir, ec)) return dir + " is not a checkpoint: it is not a directory";
  if (fs::exists(fs::path(dir) / kMetadataFile, ec)) return "";
  bool has_data = false;
  for (const auto& d : fs::directory_iterator(dir, ec))
    if (d.path().extension() == ".safetensors") has_data = true;
  if (has_data)
    return dir + " is an incomplete checkpoint: it has data files but no " + kMetadataFile +
           " (the save did not finish)";
  return dir + " is not an fsdpp checkpoint: it has no " + kMetadataFile;
}

}  // namespace fsdpp::checkpoint::detail

namespace fsdpp::checkpoint {

Metadata read_metadata(const std::string& dir) {
  const std::string why = detail::why_not_a_checkpoint(dir);
  if (!why.empty()) throw Error(why);
  const std::string path = dir + "/" + detail::kMetadataFile;
  return detail::metadata_from_json(detail::read_text_file(path), path);
}

}  // namespace fsdpp::checkpoint

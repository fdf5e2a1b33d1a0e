// The metadata file of a checkpoint.
#include "checkpoint/metadata.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/json_numbers.h"

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

int int_of(const json& j, const std::string& name, int lowest) {
  const int64_t v = int64_of(j, name);
  if (v < lowest || v > std::numeric_limits<int>::max())
    throw Error("\"" + name + "\" is " + std::to_string(v) + ", out of range");
  return static_cast<int>(v);
}

// A chunk as the metadata records it, checked against its tensor (overflow-checked: the sizes
// come from the file). Whether the chunks tile the tensor is load's and verify's check.
ChunkInfo chunk_of(const json& jc, const EntryInfo& e, const Metadata& m) {
  ChunkInfo c;
  c.offsets = int64_list(jc.at("offsets"), "offsets");
  c.sizes = int64_list(jc.at("sizes"), "sizes");
  c.file = jc.at("file").get<std::string>();
  c.name = jc.at("name").get<std::string>();
  const auto range = int64_list(jc.at("byte_range"), "byte_range");
  if (range.size() != 2) throw Error("byte_range must have two numbers");
  c.begin = range[0];
  c.end = range[1];
  c.xxh3_64 = jc.value("xxh3_64", "");
  if (c.offsets.size() != e.shape.size() || c.sizes.size() != e.shape.size())
    throw Error("a chunk's offsets/sizes do not match the shape " + shape_string(e.shape));
  for (size_t d = 0; d < e.shape.size(); ++d)
    if (c.offsets[d] < 0 || c.sizes[d] < 0 || c.offsets[d] > e.shape[d] || c.sizes[d] > e.shape[d] - c.offsets[d])
      throw Error("chunk at offsets " + shape_string(c.offsets) + " sizes " + shape_string(c.sizes) +
                  " lies outside the shape " + shape_string(e.shape));
  // Inside a shape whose byte count fits int64 (checked by the caller), so this cannot wrap.
  const int64_t bytes = numel(c.sizes) * element_size(e.dtype);
  if (c.begin < 0 || c.end < c.begin || c.end - c.begin != bytes)
    throw Error("chunk " + c.name + ": byte_range does not match its sizes and dtype");
  auto size = m.file_sizes.find(c.file);
  if (size == m.file_sizes.end()) throw Error("chunk " + c.name + " names unknown file '" + c.file + "'");
  if (c.end > size->second)
    throw Error("chunk " + c.name + ": byte_range ends at " + std::to_string(c.end) + ", past the " +
                std::to_string(size->second) + " bytes recorded for " + c.file);
  return c;
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
    const int version = int_of(j.at("version"), "version", 0);
    if (version != kFormatVersion)
      throw Error("format version " + std::to_string(version) + " is not supported (this fsdpp reads version " +
                  std::to_string(kFormatVersion) + ")");
    Metadata m;
    m.world_size = int_of(j.at("world_size"), "world_size", 1);
    int64_t total_size = 0;
    for (const auto& f : j.at("files")) {
      const auto name = f.at("name").get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
        throw Error("file name '" + name + "' is not a plain file name");
      if (m.file_sizes.count(name)) throw Error("file '" + name + "' is listed twice");
      const int64_t size = int64_of(f.at("size"), "size");
      if (size < 0) throw Error("file '" + name + "' has a negative size");
      // Sizes that add up past int64 cannot be real, and would overflow whoever sums them
      // (inspect did; found by fuzz/checkpoint_fuzzer).
      if (!checked_add(total_size, size, total_size))
        throw Error("the files' sizes add up to more bytes than a 64-bit count holds");
      m.files.push_back(name);
      m.file_sizes[name] = size;
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
        e.shape = int64_list(je.at("shape"), "shape");
        int64_t elements = 0, bytes = 0;
        if (!checked_numel(e.shape, elements) || !checked_mul(elements, element_size(e.dtype), bytes))
          throw Error("shape " + shape_string(e.shape) + " of " + e.dtype +
                      " is not a tensor size (a negative size, or more bytes than a 64-bit count holds)");
        for (const auto& jc : je.at("chunks")) e.chunks.push_back(chunk_of(jc, e, m));
      } else if (type == "int64") {
        e.kind = Entry::Kind::kInt;
        e.value = Entry(int64_of(je.at("value"), "value"));
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
    throw Error(where + " is not valid checkpoint metadata" + (key.empty() ? "" : " (entry '" + key + "')") + ": " +
                without_prefix(e.what()));
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
  return detail::metadata_from_json(detail::read_text_file(path, dir), path);
}

}  // namespace fsdpp::checkpoint

// What fsdpp-ckpt does: inspect, verify and consolidate a checkpoint.
#include <cstdio>
#include <filesystem>
#include <sstream>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/chunk_reader.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tiling.h"

namespace fsdpp::checkpoint {

using namespace detail;

namespace {

std::string value_text(const Entry& v) {
  switch (v.kind()) {
    case Entry::Kind::kInt: return std::to_string(v.to_int());
    case Entry::Kind::kDouble: {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "%.17g", v.to_double());
      return buf;
    }
    case Entry::Kind::kString: return v.to_string();
    case Entry::Kind::kBytes: return to_hex(v.to_string());
    default: return "";
  }
}

}  // namespace

std::string inspect(const std::string& dir) {
  const Metadata m = read_metadata(dir);
  std::ostringstream out;
  int64_t total = 0;
  for (const auto& [f, size] : m.file_sizes) total += size;
  out << "checkpoint " << dir << ": " << m.entries.size() << " entries, saved by " << m.world_size << " rank(s), "
      << m.files.size() << " data file(s), " << total << " bytes\n";
  for (const auto& f : m.files) out << "  file " << f << "  " << m.file_sizes.at(f) << " bytes\n";
  for (const auto& [key, e] : m.entries) {
    if (e.kind != Entry::Kind::kTensor) {
      out << key << "  " << to_string(e.kind) << "  "
          << (e.kind == Entry::Kind::kBytes ? std::to_string(e.value.to_string().size()) + " bytes"
                                            : value_text(e.value))
          << "\n";
      continue;
    }
    out << key << "  " << e.dtype << " " << shape_string(e.shape) << "  " << numel(e.shape) * element_size(e.dtype)
        << " bytes in " << e.chunks.size() << " chunk(s)\n";
    for (const auto& c : e.chunks)
      out << "  offsets " << shape_string(c.offsets) << " sizes " << shape_string(c.sizes) << "  " << c.file << " bytes ["
          << c.begin << ", " << c.end << ")  xxh3 " << (c.xxh3_64.empty() ? "-" : c.xxh3_64) << "\n";
  }
  return out.str();
}

std::vector<std::string> verify(const std::string& dir) {
  const Metadata m = read_metadata(dir);
  std::vector<std::string> problems;
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& name : m.files) {
    const std::string path = dir + "/" + name;
    try {
      File f = File::open_read(path, dir);
      if (f.size() != m.file_sizes.at(name))
        problems.push_back(path + ": " + std::to_string(f.size()) + " bytes but the metadata records " +
                           std::to_string(m.file_sizes.at(name)) +
                           (f.size() < m.file_sizes.at(name) ? " (truncated)" : ""));
      headers[name] = read_safetensors_header(f);
    } catch (const Error& e) {
      problems.push_back(without_prefix(e.what()));
    }
  }
  for (const auto& [key, e] : m.entries) {
    if (e.kind != Entry::Kind::kTensor) continue;
    for (const auto& c : e.chunks) {
      auto h = headers.find(c.file);
      if (h == headers.end()) continue;  // reported above
      auto t = h->second.tensors.find(c.name);
      if (t == h->second.tensors.end() || t->second.begin != c.begin || t->second.end != c.end ||
          t->second.dtype != e.dtype || t->second.shape != c.sizes)
        problems.push_back(dir + "/" + c.file + ": tensor '" + key + "' (chunk '" + c.name +
                           "'): the file's safetensors header does not match the metadata");
    }
    // The chunks must tile the tensor; each is then read and checked on its own.
    const std::string tiling = chunk_tiling_problem(e);
    if (!tiling.empty()) problems.push_back(dir + ": tensor '" + key + "' is not tiled exactly by its chunks: " + tiling);
    EntryInfo one = e;
    for (const auto& c : e.chunks) {
      if (!headers.count(c.file)) continue;
      one.chunks = {c};
      try {
        ChunkReader(dir, /*verify=*/true, /*confine=*/true).read(key, one, Box{c.offsets, c.sizes});
      } catch (const Error& err) {
        problems.push_back(without_prefix(err.what()));
      }
    }
  }
  return problems;
}

void consolidate(const std::string& dir, const std::string& safetensors_file) {
  const Metadata m = read_metadata(dir);
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> meta{{"format", "pt"}};
  for (const auto& [key, e] : m.entries) {
    if (e.kind == Entry::Kind::kTensor)
      specs.push_back({key, e.dtype, e.shape});
    else
      meta["fsdpp." + std::string(to_string(e.kind)) + "." + key] = value_text(e.value);
  }
  const SafetensorsLayout layout = layout_safetensors(specs, meta);
  // One tensor in memory at a time, written in order.
  const std::string tmp = safetensors_file + ".tmp";
  try {
    File f = File::create(tmp);
    f.write_all(layout.prefix.data(), static_cast<int64_t>(layout.prefix.size()), "the header");
    ChunkReader reader(dir, /*verify=*/true, /*confine=*/true);
    for (const auto& s : specs) {
      const at::Tensor t = reader.read(s.name, m.entries.at(s.name), Box{std::vector<int64_t>(s.shape.size(), 0), s.shape});
      f.write_all(t.data_ptr(), static_cast<int64_t>(t.nbytes()), "tensor '" + s.name + "'");
    }
    f.sync();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  if (std::rename(tmp.c_str(), safetensors_file.c_str()) != 0)
    throw Error("cannot rename " + tmp + " to " + safetensors_file);
}

}  // namespace fsdpp::checkpoint

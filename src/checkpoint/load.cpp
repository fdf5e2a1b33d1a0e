// Load: plan from the metadata for the caller's sharding, read only what overlaps, check it,
// and touch the caller's tensors only once everything has been read.
#include <filesystem>

#include <ATen/core/grad_mode.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/chunk_reader.h"
#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state_loader.h"
#include "checkpoint/tiling.h"
#include "memory/allocator_caching.h"

namespace fsdpp::checkpoint {

using namespace detail;

namespace {

std::string some_keys(const Metadata& m) {
  std::string s;
  int shown = 0;
  for (const auto& [key, e] : m.entries) {
    if (shown++ == 8) return s + ", ... (" + std::to_string(m.entries.size()) + " in all)";
    s += (s.empty() ? "" : ", ") + ("'" + key + "'");
  }
  return s.empty() ? "none" : s;
}

std::string dtype_and_shape(const std::string& dtype, const std::vector<int64_t>& shape) {
  return dtype + " " + shape_string(shape);
}

}  // namespace

// Reads every entry of `state` from `m` (chunks relative to `dir`) and then assigns them.
int64_t detail::load_state_from(State& state, const Metadata& m, const std::string& dir, const std::string& what,
                        const StateReadOptions& options) {
  const bool in_place = options.in_place;
  ChunkReader reader(dir, options.verify, options.confine);
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // destination, what was read
  auto keep = [&](const at::Tensor& dest, at::Tensor read) {
    if (!in_place) {
      copies.emplace_back(dest, std::move(read));
      return;
    }
    at::NoGradGuard no_grad;
    dest.copy_(read);
  };
  std::vector<std::pair<std::string, Entry>> values;
  for (const auto& [key, dest] : state) {
    auto found = m.entries.find(key);
    if (found == m.entries.end())
      throw Error(what + " has no entry '" + key + "' (it has " + some_keys(m) + ")");
    const EntryInfo& info = found->second;
    const bool saved_tensor = info.kind == Entry::Kind::kTensor || info.kind == Entry::Kind::kSharded;
    if (saved_tensor != dest.is_tensor() || (!saved_tensor && info.kind != dest.kind()))
      throw Error(what + ": entry '" + key + "' is a " + (saved_tensor ? "tensor" : to_string(info.kind)) +
                  " there but a " + to_string(dest.kind()) + " in the state to load");
    if (!dest.is_tensor()) {
      values.emplace_back(key, info.value);
      continue;
    }
    const at::ScalarType dtype =
        dest.kind() == Entry::Kind::kTensor ? dest.tensor().scalar_type()
                                            : (dest.shards().empty() ? dtype_from_name(info.dtype, key)
                                                                     : dest.shards()[0].tensor.scalar_type());
    std::string dest_dtype;
    try {
      dest_dtype = dtype_name(dtype);
    } catch (const Error&) {
      dest_dtype = c10::toString(dtype);
    }
    const bool converts = options.convert_dtype && dest_dtype != info.dtype && at::isFloatingType(dtype) &&
                          at::isFloatingType(dtype_from_name(info.dtype, what + ": tensor '" + key + "'"));
    if ((dest_dtype != info.dtype && !converts) || dest.global_shape() != info.shape)
      throw Error(what + ": tensor '" + key + "' is " + dtype_and_shape(info.dtype, info.shape) + " there but " +
                  dtype_and_shape(dest_dtype, dest.global_shape()) + " in the state to load");
    // The whole tensor, not just the rows this rank reads: a checkpoint whose chunks overlap or
    // leave a hole anywhere is corrupt (its rows cannot be trusted), and every rank says so.
    const std::string tiling = chunk_tiling_problem(info);
    if (!tiling.empty()) throw Error(what + ": tensor '" + key + "' is not tiled exactly by its chunks: " + tiling);
    if (dest.kind() == Entry::Kind::kTensor) {
      const at::Tensor& t = dest.tensor();
      keep(t, reader.read(key, info, Box{std::vector<int64_t>(t.dim(), 0), t.sizes().vec()}));
    } else {
      for (const auto& sh : dest.shards()) {
        if (sh.tensor.scalar_type() != dtype)
          throw Error(what + ": the shards of '" + key + "' in the state to load have different dtypes");
        keep(sh.tensor, reader.read(key, info, Box{sh.offsets, sh.tensor.sizes().vec()}));
      }
    }
  }
  // Everything is read and checked: now, and only now, the destinations change (in place: the
  // tensors already have).
  at::NoGradGuard no_grad;
  for (auto& [dest, read] : copies) dest.copy_(read);
  for (auto& [key, value] : values) state[key] = std::move(value);
  return reader.bytes_read();
}

EntryInfo detail::whole_tensor_entry(const TensorRecord& rec, const std::string& key, const std::string& file) {
  EntryInfo e;
  e.kind = Entry::Kind::kTensor;
  e.dtype = rec.dtype;
  e.shape = rec.shape;
  ChunkInfo c;
  c.offsets.assign(rec.shape.size(), 0);
  c.sizes = rec.shape;
  c.file = file;
  c.name = key;
  c.begin = rec.begin;
  c.end = rec.end;
  e.chunks.push_back(std::move(c));
  return e;
}

void load(State& state, const std::string& dir, const LoadOptions& options) {
  fsdpp::detail::NoCachingScope no_caching;  // the read buffers' sizes do not recur in training
  const Metadata m = read_metadata(dir);
  StateReadOptions read;
  read.verify = options.verify();
  read.confine = true;
  read.in_place = options.in_place();
  load_state_from(state, m, dir, "checkpoint " + dir, read);
}

void load_safetensors(State& state, const std::string& file) {
  fsdpp::detail::NoCachingScope no_caching;
  File f = File::open_read(file);
  const SafetensorsHeader header = read_safetensors_header(f);
  // The file as a checkpoint of whole tensors, one chunk each, without checksums.
  Metadata m;
  const std::string name = std::filesystem::path(file).filename().string();
  std::string dir = std::filesystem::path(file).parent_path().string();
  if (dir.empty()) dir = ".";
  for (const auto& [tname, rec] : header.tensors) m.entries[tname] = whole_tensor_entry(rec, tname, name);
  for (const auto& [key, dest] : state)
    if (!dest.is_tensor()) throw Error(file + ": entry '" + key + "' is a " + to_string(dest.kind()) +
                                       " but a safetensors file holds only tensors");
  load_state_from(state, m, dir, file, StateReadOptions{});
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& file) {
  File f = File::open_read(file);
  const SafetensorsHeader header = read_safetensors_header(f);
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, rec] : header.tensors) {
    at::Tensor t = at::empty(rec.shape, at::TensorOptions().dtype(dtype_from_name(rec.dtype, file + ": tensor '" + name + "'")));
    f.pread_exact(t.data_ptr(), rec.end - rec.begin, rec.begin, "tensor '" + name + "'");
    out.emplace(name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::map<std::string, at::Tensor>& tensors, const std::string& file,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  std::vector<at::Tensor> data;
  for (const auto& [name, t] : tensors) {
    data.push_back(t.detach().to(at::kCPU).contiguous());
    specs.push_back({name, dtype_name(t.scalar_type()), t.sizes().vec()});
  }
  const SafetensorsLayout layout = layout_safetensors(specs, metadata);
  const std::string tmp = file + ".tmp";
  {
    File f = File::create(tmp);
    f.write_all(layout.prefix.data(), static_cast<int64_t>(layout.prefix.size()), "the header");
    for (size_t i = 0; i < data.size(); ++i)
      f.write_all(data[i].data_ptr(), static_cast<int64_t>(data[i].nbytes()), "tensor '" + specs[i].name + "'");
    f.sync();
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) throw Error("cannot rename " + tmp + " to " + file);
}

}  // namespace fsdpp::checkpoint

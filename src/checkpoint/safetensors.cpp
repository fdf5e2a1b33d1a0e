// Writing and reading the safetensors container.
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>

#include "checkpoint/format.h"
#include "checkpoint/json_numbers.h"

namespace fsdpp::checkpoint::detail {

using nlohmann::json;

namespace {
// Larger headers are refused, as the reference implementation does.
constexpr int64_t kMaxHeader = 100 * 1000 * 1000;
}  // namespace

SafetensorsLayout layout_safetensors(const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  std::vector<std::pair<int64_t, int64_t>> relative;
  for (const auto& t : tensors) {
    if (header.contains(t.name)) throw Error("safetensors: tensor name '" + t.name + "' appears twice");
    const int64_t bytes = numel(t.shape) * element_size(t.dtype);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    relative.emplace_back(offset, offset + bytes);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  layout.prefix.resize(8);
  for (int i = 0; i < 8; ++i) layout.prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  layout.prefix += text;
  const auto start = static_cast<int64_t>(layout.prefix.size());
  for (auto [b, e] : relative) layout.ranges.emplace_back(start + b, start + e);
  layout.file_size = start + offset;
  return layout;
}

SafetensorsHeader read_safetensors_header(const File& file) {
  const std::string& path = file.path();
  const int64_t file_size = file.size();
  if (file_size < 8) throw Error(path + " is not a safetensors file: only " + std::to_string(file_size) + " bytes");
  unsigned char len_bytes[8];
  file.pread_exact(len_bytes, 8, 0, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > static_cast<uint64_t>(kMaxHeader) || static_cast<int64_t>(n) > file_size - 8)
    throw Error(path + " is not a safetensors file (or is truncated): header length " + std::to_string(n) +
                " but the file has " + std::to_string(file_size) + " bytes");
  std::string text(n, '\0');
  file.pread_exact(text.data(), static_cast<int64_t>(n), 8, "the header");
  json header;
  try {
    header = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(path + " is not a safetensors file: its header is not JSON (" + e.what() + ")");
  }
  if (!header.is_object()) throw Error(path + " is not a safetensors file: its header is not a JSON object");
  const int64_t start = 8 + static_cast<int64_t>(n);
  SafetensorsHeader out;
  // (begin, end, name): an empty tensor sorts before the tensor that begins where it sits.
  std::vector<std::tuple<int64_t, int64_t, std::string>> by_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw Error(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw Error(path + ": __metadata__ value '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const std::string what = path + ": tensor '" + name + "'";
    TensorRecord rec;
    std::vector<int64_t> offsets;
    try {
      rec.dtype = it->at("dtype").get<std::string>();
      // Integers only when they fit int64 (a float 1e40 was undefined behaviour here; found by
      // fuzz/safetensors_fuzzer).
      rec.shape = int64_list(it->at("shape"), "shape");
      offsets = int64_list(it->at("data_offsets"), "data_offsets");
    } catch (const std::exception& e) {
      throw Error(what + " has a malformed header entry: " + without_prefix(e.what()));
    }
    dtype_from_name(rec.dtype, what);
    if (offsets.size() != 2) throw Error(what + ": data_offsets must have two numbers");
    if (offsets[0] < 0 || offsets[1] < offsets[0] || !checked_add(start, offsets[1], rec.end))
      throw Error(what + ": data_offsets [" + std::to_string(offsets[0]) + ", " + std::to_string(offsets[1]) +
                  "] are not a byte range");
    rec.begin = start + offsets[0];
    // Overflow-checked: a [2^40, 2^40] shape must not wrap to 0 bytes.
    int64_t elements = 0, bytes = 0;
    if (!checked_numel(rec.shape, elements) || !checked_mul(elements, element_size(rec.dtype), bytes))
      throw Error(what + " has shape " + shape_string(rec.shape) +
                  ": a negative size, or more bytes than a 64-bit count holds");
    if (rec.end - rec.begin != bytes || rec.begin < start)
      throw Error(what + ": data_offsets span " + std::to_string(rec.end - rec.begin) + " bytes but " + rec.dtype +
                  " " + shape_string(rec.shape) + " needs " + std::to_string(bytes));
    if (rec.end > file_size)
      throw Error(path + " is truncated: tensor '" + name + "' needs bytes up to " + std::to_string(rec.end) +
                  " but the file has " + std::to_string(file_size));
    by_offset.emplace_back(rec.begin, rec.end, name);
    out.tensors[name] = std::move(rec);
  }
  // As the reference reader checks: in (begin, end) order each tensor starts at or after the
  // previous one's end. Ordering by name instead refused an empty tensor at the next tensor's
  // begin when its name sorted after that tensor's (as Python's writer places them).
  std::sort(by_offset.begin(), by_offset.end());
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (std::get<0>(by_offset[i]) < std::get<1>(by_offset[i - 1]))
      throw Error(path + ": tensors '" + std::get<2>(by_offset[i - 1]) + "' and '" + std::get<2>(by_offset[i]) +
                  "' overlap");
  return out;
}

}  // namespace fsdpp::checkpoint::detail

// Names, dtypes, checksums and boxes of the checkpoint format.
#include "checkpoint/format.h"

#include <xxhash.h>

#include <cstdio>

#include <fsdpp/error.h>

#include "common/shape_string.h"

namespace fsdpp::checkpoint::detail {

std::string data_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank-%05d.safetensors", rank);
  return buf;
}

std::string chunk_name(const std::string& key, const std::vector<int64_t>& offsets) {
  std::string name = key + "@";
  for (size_t i = 0; i < offsets.size(); ++i) name += (i ? "," : "") + std::to_string(offsets[i]);
  return name;
}

namespace {
struct DtypeName {
  at::ScalarType type;
  const char* name;
};
const DtypeName kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
    {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"}, {at::kChar, "I8"},
    {at::kByte, "U8"},    {at::kBool, "BOOL"},
};
}  // namespace

std::string dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw Error(std::string("checkpoint: dtype ") + c10::toString(t) + " has no safetensors name");
}

at::ScalarType dtype_from_name(const std::string& name, const std::string& context) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  throw Error(context + ": unsupported dtype '" + name + "'");
}

int64_t element_size(const std::string& name) {
  return static_cast<int64_t>(c10::elementSize(dtype_from_name(name, "checkpoint")));
}

int64_t numel(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool checked_mul(int64_t a, int64_t b, int64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

bool checked_add(int64_t a, int64_t b, int64_t& out) { return !__builtin_add_overflow(a, b, &out); }

bool checked_numel(const std::vector<int64_t>& sizes, int64_t& out) {
  int64_t n = 1;
  for (int64_t s : sizes)
    if (s < 0 || !checked_mul(n, s, n)) return false;
  out = n;
  return true;
}

std::string xxh3_hex(const void* data, size_t size) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(XXH3_64bits(data, size)));
  return buf;
}

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex, const std::string& context) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    throw Error(context + ": '" + std::string(1, c) + "' is not a hex digit");
  };
  if (hex.size() % 2) throw Error(context + ": odd number of hex digits");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(nibble(hex[2 * i]) * 16 + nibble(hex[2 * i + 1]));
  return out;
}

bool intersect(const Box& a, const Box& b, Box& out) {
  out.offsets.resize(a.offsets.size());
  out.sizes.resize(a.offsets.size());
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return false;
    out.offsets[d] = lo;
    out.sizes[d] = hi - lo;
  }
  return true;
}

at::Tensor view_of(const at::Tensor& t, const Box& where, const Box& part) {
  at::Tensor v = t;
  for (size_t d = 0; d < part.offsets.size(); ++d)
    v = v.narrow(static_cast<int64_t>(d), part.offsets[d] - where.offsets[d], part.sizes[d]);
  return v;
}

}  // namespace fsdpp::checkpoint::detail

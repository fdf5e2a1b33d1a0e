#pragma once
// Pieces of the on-disk format shared by save, load and the tools (docs/checkpoint-format.md).
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "common/error_text.h"
#include "common/shape_string.h"

namespace fsdpp::checkpoint::detail {

constexpr const char* kMetadataFile = "metadata.json";
constexpr const char* kFormatName = "fsdpp-checkpoint";
constexpr int kFormatVersion = 1;

// "rank-00003.safetensors"
std::string data_file_name(int rank);
// A chunk's tensor name inside its data file: "<key>@<offset0>,<offset1>,...".
std::string chunk_name(const std::string& key, const std::vector<int64_t>& offsets);

// safetensors dtype names ("F32", "BF16", ...) <-> ATen.
std::string dtype_name(at::ScalarType t);  // throws for types safetensors lacks
at::ScalarType dtype_from_name(const std::string& name, const std::string& context);
int64_t element_size(const std::string& dtype_name);

using fsdpp::detail::shape_string;
using fsdpp::detail::without_prefix;
// For sizes already checked (see checked_numel); wraps on overflow.
int64_t numel(const std::vector<int64_t>& sizes);
// Overflow-checked arithmetic for sizes read from disk: false when a size is negative or the
// result does not fit in int64 (a [2^40, 2^40] shape must not wrap to 0 elements).
bool checked_numel(const std::vector<int64_t>& sizes, int64_t& out);
bool checked_mul(int64_t a, int64_t b, int64_t& out);
bool checked_add(int64_t a, int64_t b, int64_t& out);

// XXH3_64bits as 16 lowercase hex digits.
std::string xxh3_hex(const void* data, size_t size);
std::string to_hex(const std::string& bytes);
std::string from_hex(const std::string& hex, const std::string& context);

// An N-d box: offsets + sizes. Intersection, empty when any extent is <= 0.
struct Box {
  std::vector<int64_t> offsets, sizes;
};
bool intersect(const Box& a, const Box& b, Box& out);
// The view of `t` (which covers box `where`) restricted to `part` (inside `where`).
at::Tensor view_of(const at::Tensor& t, const Box& where, const Box& part);

}  // namespace fsdpp::checkpoint::detail

#pragma once
// The safetensors container: 8-byte little-endian header length N, N bytes of JSON (padded with
// spaces so the data starts 8-byte aligned), then the tensors' raw little-endian bytes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"

namespace fsdpp::checkpoint::detail {

struct TensorSpec {
  std::string name;
  std::string dtype;  // "F32", ...
  std::vector<int64_t> shape;
};

// Where each tensor of a file to be written goes; tensors are laid out in the order given.
struct SafetensorsLayout {
  std::string prefix;  // the 8 length bytes + the padded JSON header
  std::vector<std::pair<int64_t, int64_t>> ranges;  // absolute [begin, end) per tensor
  int64_t file_size = 0;
};
SafetensorsLayout layout_safetensors(const std::vector<TensorSpec>& tensors,
                                     const std::map<std::string, std::string>& metadata);

struct TensorRecord {
  std::string dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // absolute in the file
};
struct SafetensorsHeader {
  std::map<std::string, TensorRecord> tensors;
  std::map<std::string, std::string> metadata;
};
// Parses and checks the header against the file's size; errors name the file and tensor.
SafetensorsHeader read_safetensors_header(const File& file);

}  // namespace fsdpp::checkpoint::detail

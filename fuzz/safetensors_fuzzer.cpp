// Fuzzes the safetensors header parser and load_safetensors, on the input as a whole file.
// Properties: any input either parses or throws fsdpp::Error; what parses describes byte ranges
// inside the file, of the size the dtype and shape need, overlapping no other; every tensor then
// loads; and the parsed tensors, laid out again by our writer, parse back the same.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "fuzz_check.h"
#include "scratch_dir.h"

using namespace fsdpp::checkpoint;
namespace ckd = fsdpp::checkpoint::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fsdpp_fuzz::write_scratch_file("input.safetensors", data, size);
  ckd::SafetensorsHeader header;
  try {
    header = ckd::read_safetensors_header(ckd::File::open_read(path));
  } catch (const fsdpp::Error&) {
    return 0;
  }
  // In the file's order (an empty tensor sits where the next one begins, as Python writes it).
  std::vector<std::tuple<int64_t, int64_t, std::string>> order;
  for (const auto& [name, rec] : header.tensors) {
    int64_t elements = 0;
    FUZZ_CHECK(ckd::checked_numel(rec.shape, elements), "a parsed shape overflows");
    FUZZ_CHECK(rec.begin >= 8 && rec.begin <= rec.end && rec.end <= static_cast<int64_t>(size),
               "a parsed byte range lies outside the file");
    FUZZ_CHECK(rec.end - rec.begin == elements * ckd::element_size(rec.dtype), "a byte range has the wrong size");
    for (const auto& [other, o] : header.tensors)
      FUZZ_CHECK(other == name || rec.begin == rec.end || o.begin == o.end || rec.end <= o.begin || o.end <= rec.begin,
                 "two parsed tensors overlap");
    order.emplace_back(rec.begin, rec.end, name);
  }
  std::sort(order.begin(), order.end());
  std::vector<ckd::TensorSpec> specs;
  for (const auto& [begin, end, name] : order) specs.push_back({name, header.tensors[name].dtype, header.tensors[name].shape});
  std::map<std::string, at::Tensor> tensors;
  try {
    tensors = load_safetensors(path);
  } catch (const fsdpp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "a file whose header parsed does not load");
  }
  FUZZ_CHECK(tensors.size() == header.tensors.size(), "load_safetensors lost a tensor");
  // Our writer's layout of the same tensors (data left as zeros) reads back the same.
  const ckd::SafetensorsLayout layout = ckd::layout_safetensors(specs, header.metadata);
  std::string file = layout.prefix;
  file.resize(static_cast<size_t>(layout.file_size), '\0');
  const std::string again_path = fsdpp_fuzz::write_scratch_file("again.safetensors", file);
  ckd::SafetensorsHeader again;
  try {
    again = ckd::read_safetensors_header(ckd::File::open_read(again_path));
  } catch (const fsdpp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "our writer's layout of parsed tensors does not parse");
  }
  FUZZ_CHECK(again.metadata == header.metadata && again.tensors.size() == header.tensors.size(),
             "our writer's layout reads back different");
  for (const auto& [name, rec] : header.tensors) {
    const auto it = again.tensors.find(name);
    FUZZ_CHECK(it != again.tensors.end() && it->second.dtype == rec.dtype && it->second.shape == rec.shape,
               "our writer's layout reads back a different tensor");
  }
  return 0;
}

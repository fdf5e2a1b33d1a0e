// Fuzzes a whole checkpoint directory: metadata.json plus up to two data files, cut from the
// input at each kSeparator. Runs what fsdpp-ckpt and load run on it: inspect, verify, and, when
// verify finds it sound, consolidate and load (into tensors of the saved shapes).
// Properties: every call returns or throws fsdpp::Error; a checkpoint verify passes consolidates
// and loads, and load reads the values consolidate wrote.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/format.h"
#include "fuzz_check.h"
#include "scratch_dir.h"

using namespace fsdpp::checkpoint;
namespace ckd = fsdpp::checkpoint::detail;

namespace {

// Between the parts of an input (see fuzz/corpus/checkpoint_fuzzer and fuzz/checkpoint.dict).
const std::string kSeparator = "\n=====fsdpp-fuzz-file=====\n";
const char* const kFiles[] = {"metadata.json", "rank-00000.safetensors", "rank-00001.safetensors"};

std::vector<std::string> split(const std::string& input) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (parts.size() + 1 < std::size(kFiles)) {
    const size_t at = input.find(kSeparator, from);
    if (at == std::string::npos) break;
    parts.push_back(input.substr(from, at - from));
    from = at + kSeparator.size();
  }
  parts.push_back(input.substr(from));
  return parts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = split(std::string(reinterpret_cast<const char*>(data), size));
  for (size_t i = 0; i < std::size(kFiles); ++i) {
    if (i < parts.size())
      fsdpp_fuzz::write_scratch_file(kFiles[i], parts[i]);
    else
      fsdpp_fuzz::remove_scratch_file(kFiles[i]);
  }
  const std::string& dir = fsdpp_fuzz::scratch_dir();
  Metadata m;
  try {
    (void)inspect(dir);
    m = read_metadata(dir);
    if (!verify(dir).empty()) return 0;
  } catch (const fsdpp::Error&) {
    return 0;
  }
  // Sound, says verify: every tensor can be read whole, so consolidate and load must succeed.
  const std::string consolidated = dir + "/consolidated.safetensors";
  State state;
  for (const auto& [key, e] : m.entries)
    state[key] = e.kind == Entry::Kind::kTensor
                     ? Entry(at::empty(e.shape, at::TensorOptions().dtype(ckd::dtype_from_name(e.dtype, key))))
                     : e.value;
  try {
    consolidate(dir, consolidated);
    load(state, dir);
  } catch (const fsdpp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "a checkpoint that verify passed does not consolidate or load");
  }
  const auto whole = load_safetensors(consolidated);
  for (const auto& [key, e] : state) {
    if (!e.is_tensor()) continue;
    const at::Tensor& loaded = e.tensor();
    // Compare bytes: NaNs are not equal to themselves.
    const at::Tensor& written = whole.at(key);
    // An empty tensor may have no storage at all: memcmp must not see its null pointer.
    FUZZ_CHECK(loaded.nbytes() == written.nbytes() &&
                   (loaded.nbytes() == 0 ||
                    std::memcmp(loaded.data_ptr(), written.data_ptr(), loaded.nbytes()) == 0),
               "load and consolidate read different values");
  }
  return 0;
}

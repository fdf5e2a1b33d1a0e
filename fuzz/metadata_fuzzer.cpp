// Fuzzes the metadata.json parser and what checks a parsed tensor (the tiling proof).
// Properties: any input either parses or throws fsdpp::Error (any other exception, a crash or a
// sanitizer report is a bug); what parses is written back by metadata_to_json without throwing,
// and that text reads back to the same metadata.
#include <cstddef>
#include <cstdint>
#include <string>

#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

#include "checkpoint/metadata.h"
#include "checkpoint/tiling.h"
#include "fuzz_check.h"

using namespace fsdpp::checkpoint;
namespace ckd = fsdpp::checkpoint::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Metadata m;
  try {
    m = ckd::metadata_from_json(text, "metadata.json");
  } catch (const fsdpp::Error&) {
    return 0;
  }
  for (const auto& [key, e] : m.entries)
    if (e.kind == Entry::Kind::kTensor) (void)ckd::chunk_tiling_problem(e);
  const std::string written = ckd::metadata_to_json(m);
  Metadata again;
  try {
    again = ckd::metadata_from_json(written, "rewritten metadata.json");
  } catch (const fsdpp::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    FUZZ_CHECK(false, "metadata that parsed, written back, does not parse");
  }
  FUZZ_CHECK(ckd::metadata_to_json(again) == written, "metadata written back reads back differently");
  return 0;
}

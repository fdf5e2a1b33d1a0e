#pragma once
// Loading a checkpoint State from a Metadata (a checkpoint's, or a safetensors file or Hugging
// Face directory seen as one): plan from the metadata for the caller's sharding, read only what
// overlaps, check it, and touch the caller's tensors only once everything has been read (unless
// in_place).
#include <cstdint>
#include <string>

#include <fsdpp/checkpoint.h>

#include "checkpoint/safetensors.h"

namespace fsdpp::checkpoint::detail {

struct StateReadOptions {
  bool verify = false;         // read whole chunks and check their checksums
  bool confine = false;        // chunk files must lie inside the directory (a checkpoint's must)
  bool in_place = false;       // each tensor as soon as it is read (else all at the end)
  bool convert_dtype = false;  // a floating tensor saved in another floating dtype is converted
};

// Returns the tensor bytes read from files. `what` names the source in errors.
int64_t load_state_from(State& state, const Metadata& m, const std::string& dir, const std::string& what,
                        const StateReadOptions& options);

// A plain safetensors file's tensor as a checkpoint entry: one whole chunk of `file` (relative to
// the directory), without a checksum.
EntryInfo whole_tensor_entry(const TensorRecord& rec, const std::string& key, const std::string& file);

}  // namespace fsdpp::checkpoint::detail

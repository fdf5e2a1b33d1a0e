#pragma once
// Loading a checkpoint State from a Metadata (a checkpoint's, or a safetensors file or Hugging
// Face directory seen as one): plan from the metadata for the caller's sharding, read only what
// overlaps, check it, and touch the caller's tensors only once everything has been read.
#include <cstdint>
#include <string>

#include <fsdpp/checkpoint.h>

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

}  // namespace fsdpp::checkpoint::detail

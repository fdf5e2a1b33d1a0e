#pragma once
// The last out-of-memory error the memory limit raised in this process, so that a peer rank
// waiting for this one in a collective learns why it never came (comm/collective_intent.cpp).
// Private to fsdpp.
#include <cstdint>

namespace fsdpp::detail {

struct OutOfMemoryRecord {
  int64_t count = 0;  // out-of-memory errors raised so far; 0: none
  int64_t asked = 0, in_use = 0, limit = 0;  // bytes, of the last one
};

OutOfMemoryRecord last_out_of_memory();

}  // namespace fsdpp::detail

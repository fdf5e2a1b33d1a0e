#include "comm/gather_layout.h"

#include <algorithm>
#include <cstring>

namespace fsdpp::detail {

void GatherLayout::place(void* output, int member, int64_t first, int64_t count, const void* source,
                         size_t element_size) const {
  auto* out = static_cast<char*>(output);
  const auto* in = static_cast<const char*>(source);
  const auto es = static_cast<int64_t>(element_size);
  while (count > 0) {
    const int64_t block = first / block_numel, within = first % block_numel;
    const int64_t rank = member * blocks_per_member + block;
    // The last piece starting at or before `within` (an empty piece shares its offset with the next).
    const auto piece = std::upper_bound(pieces.begin(), pieces.end(), within,
                                        [](int64_t x, const Piece& p) { return x < p.input_offset; }) -
                       1;
    const int64_t into = within - piece->input_offset;
    const int64_t n = std::min(count, piece->numel - into);
    std::memcpy(out + (rank_output_offset(*piece, rank) + into) * es, in, static_cast<size_t>(n * es));
    first += n;
    in += n * es;
    count -= n;
  }
}

void GatherLayout::place_rank_major(void* output, const void* gathered, size_t element_size) const {
  const int64_t member_numel = block_numel * blocks_per_member;
  const auto* from = static_cast<const char*>(gathered);
  for (int64_t m = 0; m < ranks / blocks_per_member; ++m)
    place(output, static_cast<int>(m), 0, member_numel, from + m * member_numel * static_cast<int64_t>(element_size),
          element_size);
}

}  // namespace fsdpp::detail

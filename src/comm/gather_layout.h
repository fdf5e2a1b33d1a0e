#pragma once
// Where an all-gather puts each rank's input, when not rank after rank as
// all_gather_into_tensor does: FSDP gathers straight into its unsharded, parameter-major
// layout, so no rank-major copy of the unit ever exists beside the parameters. Private to fsdpp.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdpp::detail {

struct GatherLayout {
  // A run of `numel` elements at `input_offset` of a rank's block; each rank's copy of it goes
  // where rank_output_offset says (FSDP: a parameter's padded chunk, its rows among all ranks').
  struct Piece {
    int64_t input_offset, numel, output_offset;
  };
  // The placement rule, for the host's copies and the device's alike: rank v's copy of `piece`
  // starts at output_offset + v * numel, the ranks' copies side by side in rank order. (Affine in
  // v, so a device places a piece for every rank with one strided copy.)
  static int64_t rank_output_offset(const Piece& piece, int64_t rank) {
    return piece.output_offset + rank * piece.numel;
  }
  std::vector<Piece> pieces;  // in input order, covering [0, block_numel) without gaps
  int64_t block_numel = 0;
  // A member's input is this many consecutive ranks' blocks (FSDP's k-way post-forward shard:
  // member m holds the blocks of ranks m * blocks_per_member, ...).
  int64_t blocks_per_member = 1;
  int64_t ranks = 1;  // whose blocks it places: ranks / blocks_per_member members

  // Copies `count` elements from element `first` of member `member`'s input, found at `source`,
  // to their places in `output`.
  void place(void* output, int member, int64_t first, int64_t count, const void* source, size_t element_size) const;
  // The same for every member's whole input, from an all_gather_into_tensor output (rank-major).
  void place_rank_major(void* output, const void* gathered, size_t element_size) const;
};

}  // namespace fsdpp::detail

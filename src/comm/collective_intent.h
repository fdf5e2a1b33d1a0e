#pragma once
// The cross-rank intent check: before each collective (when the group's check_collectives is
// on) the ranks exchange what they are about to issue, so that a mismatch (another kind, dtype,
// size, op, root or sequence number) is a clear error naming every rank's call instead of a hang
// or garbage. Private to fsdpp.
#include <cstdint>
#include <vector>

namespace fsdpp::detail {

struct ProcessGroupImpl;

// The collectives a group's comm thread runs, as numbered in an Intent and named in messages.
enum CollectiveKind { kAllReduce, kBroadcast, kAllGather, kReduceScatter, kAllToAll, kBarrier, kBroadcastBytes };
// "all_reduce", "broadcast", ...: PyTorch's names.
const char* collective_name(CollectiveKind kind);

// What a rank is about to do; -1 in a field it does not use.
struct CollectiveIntent {
  enum Field { kKind, kSeq, kDtype, kInput, kOutput, kOp, kRoot, kExtra, kFields };
  std::vector<int64_t> fields = std::vector<int64_t>(kFields, -1);
  std::vector<int64_t> extra;  // all_to_all_single: this rank's input then output split sizes
};

// Exchanges `intent` over `g` (run on its comm thread, before the exchange itself) and throws
// fsdpp::Error describing each rank's collective if they differ, or, for all_to_all_single,
// naming the pair of ranks whose split sizes disagree.
void check_intent(const ProcessGroupImpl& g, const CollectiveIntent& intent);

}  // namespace fsdpp::detail

// The cross-rank intent check (comm/collective_intent.h): one small all-gather of each rank's
// intent over the group's own backend, compared before the collective runs.
#include "comm/collective_intent.h"

#include <atomic>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "comm/process_group_impl.h"
#include "memory/out_of_memory_record.h"

namespace fsdpp::detail {
namespace {

const char* const kKindNames[] = {"all_reduce",        "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor",
                                  "all_to_all_single", "barrier",   "broadcast_bytes"};

std::string describe(const std::vector<int64_t>& f) {
  std::ostringstream out;
  int64_t kind = f[CollectiveIntent::kKind];
  out << (kind >= 0 && kind <= kBroadcastBytes ? kKindNames[kind] : "?") << " #" << f[CollectiveIntent::kSeq];
  if (f[CollectiveIntent::kDtype] >= 0)
    out << " " << c10::toString(static_cast<at::ScalarType>(f[CollectiveIntent::kDtype]));
  if (f[CollectiveIntent::kInput] >= 0) out << " input " << f[CollectiveIntent::kInput] << " elements";
  if (f[CollectiveIntent::kOutput] >= 0) out << " output " << f[CollectiveIntent::kOutput] << " elements";
  if (f[CollectiveIntent::kOp] >= 0) out << " op " << to_string(static_cast<ReduceOp>(f[CollectiveIntent::kOp]));
  if (f[CollectiveIntent::kRoot] >= 0) out << " src rank " << f[CollectiveIntent::kRoot];
  return out.str();
}

std::vector<at::Tensor> exchange(const ProcessGroupImpl& g, const std::vector<int64_t>& values) {
  at::Tensor mine = at::tensor(values, at::kLong);
  std::vector<at::Tensor> inputs{mine};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < g.size(); ++i) outputs[0].push_back(at::empty_like(mine));
  g.backend->allgather(outputs, inputs)->wait(g.timeout);
  return outputs[0];
}

// Behind each rank's intent: whether it ran out of memory since its previous collective, and
// the bytes of that error. A rank whose work ended in an out-of-memory error comes to its next
// collective (a barrier, a cleanup) while its peers wait in the one it never reached: they then
// fail with the same kind of error, naming that rank, not with a disagreement about collectives.
enum OutOfMemoryField { kRecent, kAsked, kInUse, kLimit, kOutOfMemoryFields };

std::vector<int64_t> out_of_memory_fields() {
  // Process-wide: the first check after an error tells it, on whichever group comes next; a
  // group made later does not tell an old one again.
  static std::atomic<int64_t> seen{0};
  const OutOfMemoryRecord last = last_out_of_memory();
  const bool recent = seen.exchange(last.count) != last.count;
  return {recent ? 1 : 0, last.asked, last.in_use, last.limit};
}

[[noreturn]] void throw_peer_out_of_memory(const ProcessGroupImpl& g, const std::vector<at::Tensor>& all,
                                           const std::string& disagreement) {
  for (int q = 0; q < g.size(); ++q) {
    const int64_t* f = all[q].data_ptr<int64_t>() + CollectiveIntent::kFields;
    if (f[kRecent] == 0) continue;
    throw c10::OutOfMemoryError(
        c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        "rank " + std::to_string(g.ranks[q]) + " of " + g.name + " ran out of memory under fsdpp's memory limit " +
            "(tried to allocate " + std::to_string(f[kAsked]) + " bytes with " + std::to_string(f[kInUse]) +
            " bytes in use and a limit of " + std::to_string(f[kLimit]) +
            " bytes) and left the collective the others wait in (" + disagreement + ")");
  }
  throw Error(disagreement);
}

}  // namespace

const char* collective_name(CollectiveKind kind) { return kKindNames[kind]; }

void check_intent(const ProcessGroupImpl& g, const CollectiveIntent& intent) {
  std::vector<int64_t> with_oom = intent.fields;
  const auto oom = out_of_memory_fields();
  with_oom.insert(with_oom.end(), oom.begin(), oom.end());
  auto all = (exchange)(g, with_oom);  // parenthesized: not std::exchange, which ADL would find
  const auto collective = [&](int r) { return all[r].narrow(0, 0, CollectiveIntent::kFields); };
  std::ostringstream mismatch;
  for (int r = 0; r < g.size(); ++r) {
    if (!collective(r).equal(collective(g.rank))) {
      mismatch << "ranks of " << g.name << " disagree on a collective: ";
      for (int q = 0; q < g.size(); ++q) {
        const int64_t* f = all[q].data_ptr<int64_t>();
        std::vector<int64_t> v(f, f + CollectiveIntent::kFields);
        mismatch << (q ? "; " : "") << "rank " << g.ranks[q] << ": " << describe(v);
      }
      throw_peer_out_of_memory(g, all, mismatch.str());
    }
  }
  if (intent.extra.empty()) return;
  // all_to_all_single: what rank i sends to j must be what j expects from i.
  auto splits = exchange(g, intent.extra);
  const int n = g.size();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      int64_t sends = splits[i].data_ptr<int64_t>()[j];
      int64_t expects = splits[j].data_ptr<int64_t>()[n + i];
      if (sends != expects)
        throw Error("all_to_all_single: rank " + std::to_string(g.ranks[i]) + " sends " + std::to_string(sends) +
                    " elements to rank " + std::to_string(g.ranks[j]) + ", which expects " + std::to_string(expects));
    }
}

}  // namespace fsdpp::detail

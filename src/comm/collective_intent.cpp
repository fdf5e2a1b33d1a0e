// The cross-rank intent check (comm/collective_intent.h): one small all-gather of each rank's
// intent over the group's own backend, compared before the collective runs.
#include "comm/collective_intent.h"

#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "comm/process_group_impl.h"

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

}  // namespace

const char* collective_name(CollectiveKind kind) { return kKindNames[kind]; }

void check_intent(const ProcessGroupImpl& g, const CollectiveIntent& intent) {
  auto all = exchange(g, intent.fields);
  std::ostringstream mismatch;
  for (int r = 0; r < g.size(); ++r) {
    if (!all[r].equal(all[g.rank])) {
      mismatch << "ranks of " << g.name << " disagree on a collective: ";
      for (int q = 0; q < g.size(); ++q) {
        auto f = all[q];
        std::vector<int64_t> v(f.data_ptr<int64_t>(), f.data_ptr<int64_t>() + f.numel());
        mismatch << (q ? "; " : "") << "rank " << g.ranks[q] << ": " << describe(v);
      }
      throw Error(mismatch.str());
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

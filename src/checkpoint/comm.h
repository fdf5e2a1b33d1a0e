#pragma once
// The ranks of a collective checkpoint operation (save, export_safetensors) and how they agree:
// every rank's string to every rank, and group rank 0's string to every rank. A process alone
// (no process group) needs no collectives.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/process_group.h>

namespace fsdpp::checkpoint::detail {

struct Comm {
  ProcessGroup group;
  bool alone = true;
  int rank = 0, size = 1;

  // `g`, or the default group when `g` is empty and init_process_group ran, else alone.
  static Comm of(ProcessGroup g, const std::string& api) {
    Comm c;
    if (!g.defined() && is_initialized()) g = default_group();
    if (g.defined()) {
      if (!g.is_member()) throw Error(api + ": this rank is not a member of group " + g.name());
      c.group = g;
      c.rank = g.rank();
      c.size = g.size();
      c.alone = c.size == 1;
    }
    return c;
  }

  std::vector<std::string> all_gather(const std::string& mine) const {
    if (alone) return {mine};
    at::Tensor lengths = at::empty({size}, at::kLong);
    all_gather_into_tensor(lengths, at::tensor({static_cast<int64_t>(mine.size())}, at::kLong), group);
    const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
    at::Tensor in = at::zeros({longest}, at::kByte);
    std::memcpy(in.data_ptr(), mine.data(), mine.size());
    at::Tensor out = at::empty({longest * size}, at::kByte);
    all_gather_into_tensor(out, in, group);
    std::vector<std::string> all(size);
    const auto* p = static_cast<const char*>(out.data_ptr());
    for (int r = 0; r < size; ++r) all[r].assign(p + r * longest, static_cast<size_t>(lengths[r].item<int64_t>()));
    return all;
  }

  // From group rank 0 to every rank.
  void broadcast(std::string& bytes) const {
    if (!alone) broadcast_bytes(bytes, group.global_rank(0), group);
  }
};

}  // namespace fsdpp::checkpoint::detail

// Groups made from a group: new_group's children, and the consecutive, strided and members-only
// subgroups that meshes and HSDP are built from (process_group_impl.h), each connected on its
// members and cached on its parent where every member must find the same one.
#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fsdpp/error.h>
#include <fsdpp/process_group.h>

#include "comm/error_message.h"
#include "comm/group_connection.h"
#include "comm/process_group_impl.h"

namespace fsdpp {
namespace detail {
namespace {

// A child of `parent` over the sorted global `ranks`, named `name`: connected, with its comm
// thread, on its members (every member makes it alike); an empty handle of it elsewhere.
ProcessGroup make_child(const ProcessGroupImpl& parent, std::string name, std::vector<int> ranks) {
  auto child = std::make_shared<ProcessGroupImpl>();
  child->name = std::move(name);
  child->backend_name = parent.backend_name;
  child->store = parent.store;
  child->ranks = std::move(ranks);
  child->global_rank = parent.global_rank;
  child->timeout = parent.timeout;
  child->check_collectives = parent.check_collectives;
  auto me = std::find(child->ranks.begin(), child->ranks.end(), parent.global_rank);
  if (me != child->ranks.end()) {
    child->rank = static_cast<int>(me - child->ranks.begin());
    connect_group(*child, /*local_only=*/false, child->timeout);
    child->comm_thread = std::make_unique<CommThread>();
  }
  return ProcessGroup(std::move(child));
}

}  // namespace

ProcessGroup consecutive_subgroup(const ProcessGroup& group, int k) {
  const ProcessGroupImpl& g = group.impl();
  std::lock_guard<std::mutex> lock(g.subgroups_mutex);
  auto it = g.consecutive_subgroups.find(k);
  if (it != g.consecutive_subgroups.end()) return it->second;
  ProcessGroup mine;
  for (int first = 0; first < g.size(); first += k) {
    std::vector<int> ranks(g.ranks.begin() + first, g.ranks.begin() + std::min(first + k, g.size()));
    ProcessGroup sub = group.new_group(ranks);
    if (sub.is_member()) mine = sub;
  }
  return g.consecutive_subgroups[k] = mine;
}

ProcessGroup strided_subgroup(const ProcessGroup& group, int k) {
  const ProcessGroupImpl& g = group.impl();
  std::lock_guard<std::mutex> lock(g.subgroups_mutex);
  auto it = g.strided_subgroups.find(k);
  if (it != g.strided_subgroups.end()) return it->second;
  ProcessGroup mine;
  for (int first = 0; first < std::min(k, g.size()); ++first) {
    std::vector<int> ranks;
    for (int i = first; i < g.size(); i += k) ranks.push_back(g.ranks[i]);
    ProcessGroup sub = group.new_group(ranks);
    if (sub.is_member()) mine = sub;
  }
  return g.strided_subgroups[k] = mine;
}

ProcessGroup members_group(const ProcessGroup& group, std::vector<int> ranks) {
  const ProcessGroupImpl& parent = group.impl();
  std::sort(ranks.begin(), ranks.end());
  std::lock_guard<std::mutex> lock(parent.subgroups_mutex);
  auto it = parent.member_groups.find(ranks);
  if (it != parent.member_groups.end()) return it->second;
  if (ranks.empty()) throw Error("members_group: the list of ranks is empty");
  std::string label;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i && ranks[i] == ranks[i - 1])
      throw Error("members_group: rank " + std::to_string(ranks[i]) + " is listed twice in " + list_ranks(ranks));
    if (std::find(parent.ranks.begin(), parent.ranks.end(), ranks[i]) == parent.ranks.end())
      throw Error("members_group: rank " + std::to_string(ranks[i]) + " is outside group " + parent.name + " " +
                  list_ranks(parent.ranks));
    label += (i ? "," : "") + std::to_string(ranks[i]);
  }
  auto me = std::find(ranks.begin(), ranks.end(), parent.global_rank);
  if (me == ranks.end())
    throw Error("members_group: global rank " + std::to_string(parent.global_rank) + " is not among " +
                list_ranks(ranks) + ", whose members alone make their group");
  // Named after its ranks, not numbered as new_group's children: only its members make it, so
  // a counter would differ across the ranks of the parent.
  return parent.member_groups[ranks] = make_child(parent, parent.name + "/{" + label + "}", ranks);
}

}  // namespace detail

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks) const {
  const auto& parent = impl();
  if (ranks.empty()) throw Error("new_group: the list of ranks is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i && sorted[i] == sorted[i - 1]) throw Error("new_group: rank " + std::to_string(sorted[i]) + " is listed twice");
    if (std::find(parent.ranks.begin(), parent.ranks.end(), sorted[i]) == parent.ranks.end())
      throw Error("new_group: rank " + std::to_string(sorted[i]) + " is outside group " + parent.name + " " +
                  detail::list_ranks(parent.ranks));
  }
  return detail::make_child(parent, parent.name + "/" + std::to_string(parent.next_child++), std::move(sorted));
}

}  // namespace fsdpp

// The process group itself: init_process_group (the world's rendezvous, then its connection), the
// default group, and what a ProcessGroup handle answers. Its parts, one concept a file:
// `rendezvous` (where the ranks meet), `group_connection` (how a group's members connect),
// `subgroups` (groups made from a group), `process_setup` (environment variables, SIGPIPE) and
// `device_backend` (the backend string).
#include <fsdpp/process_group.h>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include <fsdpp/error.h>

#include "comm/device_backend.h"
#include "comm/error_message.h"
#include "comm/group_connection.h"
#include "comm/process_group_impl.h"
#include "comm/process_setup.h"
#include "comm/rendezvous.h"
#include "compat/cuda_runtime.h"
#include "profiler/timeline.h"

namespace fsdpp {
namespace {

using detail::list_ranks;
using detail::message_without_backtrace;

std::mutex g_default_mutex;
std::shared_ptr<detail::ProcessGroupImpl> g_default_group;

}  // namespace

namespace detail {

ProcessGroupImpl::~ProcessGroupImpl() {
  comm_thread.reset();
  if (device_backend && device_backend != backend) {
    try {
      compat::shutdown_nccl_backend(device_backend);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fsdpp: shutting down the NCCL backend of %s failed: %s\n", where().c_str(),
                   message_without_backtrace(e).c_str());
    }
  }
}

std::string ProcessGroupImpl::where() const {
  return "group " + name + " (rank " + std::to_string(rank) + " of " + std::to_string(size()) + ")";
}

const ProcessGroupImpl& member_group(const ProcessGroup& group, const char* collective) {
  ProcessGroup resolved = group.defined() ? group : default_group();
  const ProcessGroupImpl& g = resolved.impl();
  if (!g.backend)
    throw Error(std::string(collective) + ": global rank " + std::to_string(g.global_rank) +
                " is not a member of group " + g.name + " " + list_ranks(g.ranks));
  return g;
}

}  // namespace detail

const detail::ProcessGroupImpl& ProcessGroup::impl() const {
  if (!impl_) throw Error("use of an empty ProcessGroup handle");
  return *impl_;
}

int ProcessGroup::rank() const { return impl().rank; }
int ProcessGroup::size() const { return impl().size(); }
bool ProcessGroup::is_member() const { return impl().rank >= 0; }
const std::vector<int>& ProcessGroup::ranks() const { return impl().ranks; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl().timeout; }
bool ProcessGroup::check_collectives() const { return impl().check_collectives; }
const std::string& ProcessGroup::name() const { return impl().name; }
c10::intrusive_ptr<c10d::ProcessGroup> ProcessGroup::backend() const { return impl().c10d_group; }

int ProcessGroup::group_rank(int global) const {
  const auto& r = impl().ranks;
  auto it = std::find(r.begin(), r.end(), global);
  if (it == r.end())
    throw Error("global rank " + std::to_string(global) + " is not a member of group " + name() + " " + list_ranks(r));
  return static_cast<int>(it - r.begin());
}

int ProcessGroup::global_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= size())
    throw Error("group rank " + std::to_string(group_rank) + " is outside group " + name() + " of size " +
                std::to_string(size()));
  return impl().ranks[group_rank];
}

ProcessGroup init_process_group(const InitProcessGroupOptions& options) {
  detail::device_backend_of(options.backend());  // a misspelt backend fails before the rendezvous
  detail::ignore_sigpipe_as_python_does();
  // One deadline for the whole rendezvous: store, arrival of every rank.
  const std::chrono::milliseconds timeout = detail::timeout_from(options.timeout());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  const bool fake = detail::device_backend_of(options.backend()) == detail::DeviceBackend::kFake;
  const detail::Rendezvous r = fake ? detail::fake_rendezvous(options) : detail::rendezvous(options, timeout);
  auto g = std::make_shared<detail::ProcessGroupImpl>();
  g->name = "world";
  g->backend_name = options.backend();
  g->store = r.store;
  g->ranks.resize(r.world_size);
  for (int i = 0; i < r.world_size; ++i) g->ranks[i] = i;
  g->global_rank = r.rank;
  g->rank = r.rank;
  g->timeout = timeout;
  g->check_collectives = detail::check_collectives_from(options.check_collectives());
  g->store->setTimeout(timeout);
  detail::connect_group(*g, r.local_only, left(), r.master_host);
  g->comm_thread = std::make_unique<detail::CommThread>();
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default_group = g;
  profiler::detail::set_process_rank(g->global_rank);  // the profiler labels its trace with it
  return ProcessGroup(g);
}

ProcessGroup default_group() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  if (!g_default_group)
    throw Error("no default process group: call fsdpp::init_process_group() first or pass a group");
  return ProcessGroup(g_default_group);
}

bool is_initialized() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  return g_default_group != nullptr;
}

void destroy_process_group() {
  std::lock_guard<std::mutex> lock(g_default_mutex);
  g_default_group.reset();
  profiler::detail::set_process_rank(-1);
}

}  // namespace fsdpp

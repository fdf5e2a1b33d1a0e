#include <fsdpp/process_group.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fsdpp/error.h>
#include <fsdpp/slurm_environment.h>

#include "comm/error_message.h"
#include "comm/fake_backend.h"
#include "comm/nccl_contract_backend.h"
#include "comm/local_address.h"
#include "comm/process_group_impl.h"
#include "comm/store_socket.h"
#include "common/loopback.h"
#include "common/store_secret.h"
#include "compat/cuda_runtime.h"
#include "compat/tcp_store_options.h"
#include "profiler/timeline.h"

namespace fsdpp {
namespace {

// What carries CUDA tensors under a backend string, in PyTorch's forms: "gloo" (CPU and CUDA
// tensors over Gloo), "nccl", and device:backend pairs such as "cpu:gloo,cuda:nccl". fsdpp's own
// exchanges (metadata, the intent check) and CPU tensors always go over Gloo, so "nccl" alone
// takes CPU tensors too, where PyTorch's would refuse them. "fake" (comm/fake_backend.h) carries
// both and moves nothing. "nccl-contract" (comm/nccl_contract_backend.h, for tests) carries CPU
// tensors by NCCL's contract, on CPU comm streams.
enum class DeviceBackend { kGloo, kNccl, kFake, kNcclContract };

DeviceBackend device_backend_of(const std::string& backend) {
  const std::string expected = "'gloo', 'nccl', 'fake' or device:backend pairs such as 'cpu:gloo,cuda:nccl'";
  if (backend == "gloo") return DeviceBackend::kGloo;
  if (backend == "nccl") return DeviceBackend::kNccl;
  if (backend == "fake") return DeviceBackend::kFake;
  if (backend == "nccl-contract") return DeviceBackend::kNcclContract;
  if (backend.find(':') == std::string::npos)
    throw Error("backend '" + backend + "' is not available: fsdpp takes " + expected);
  DeviceBackend cuda = DeviceBackend::kGloo;
  std::stringstream pairs(backend);
  for (std::string pair; std::getline(pairs, pair, ',');) {
    const auto colon = pair.find(':');
    const std::string device = pair.substr(0, colon);
    const std::string name = colon == std::string::npos ? "" : pair.substr(colon + 1);
    if (device == "cpu" && name == "gloo") continue;
    if (device == "cuda" && (name == "gloo" || name == "nccl")) {
      cuda = name == "nccl" ? DeviceBackend::kNccl : DeviceBackend::kGloo;
      continue;
    }
    throw Error("backend '" + backend + "': '" + pair + "' is not available: fsdpp takes " + expected +
                " (cpu tensors over gloo, cuda tensors over gloo or nccl)");
  }
  return cuda;
}

using detail::list_ranks;
using detail::message_without_backtrace;

std::mutex g_default_mutex;
std::shared_ptr<detail::ProcessGroupImpl> g_default_group;

// An integer environment variable; `fallback` when unset, an error naming it when malformed.
int env_int(const char* name, int fallback, bool required, const std::string& why) {
  const char* value = std::getenv(name);
  if (!value || !*value) {
    if (required) throw Error("environment variable " + std::string(name) + " is not set (" + why + ")");
    return fallback;
  }
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (*end != '\0' || parsed < 0 || parsed > (1 << 30))
    throw Error("environment variable " + std::string(name) + "='" + value +
                "' is not a non-negative integer");
  return static_cast<int>(parsed);
}

std::string env_string(const char* name, const std::string& why) {
  const char* value = std::getenv(name);
  if (!value || !*value) throw Error("environment variable " + std::string(name) + " is not set (" + why + ")");
  return value;
}

int parse_port(const std::string& text, const std::string& source) {
  char* end = nullptr;
  long port = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || port < 1 || port > 65535)
    throw Error(source + "='" + text + "' is not a valid TCP port (1-65535)");
  return static_cast<int>(port);
}

// One Gloo device per process, shared by all groups (as PyTorch does). Without
// GLOO_SOCKET_IFNAME, PyTorch binds to what the host name resolves to, often 127.0.0.1 or
// nothing at all, so peers on other nodes cannot connect; fsdpp binds to the address whose
// route leads to the master (`master_host`), and to loopback only when the master is local.
// The process's Gloo device and the address it was asked to bind, for error messages (asking the
// device itself would be a virtual call through Gloo's headers, which fsdpp avoids: docs/building.md).
struct BoundGlooDevice {
  compat::GlooDevice device;
  std::string address;
};

BoundGlooDevice gloo_device(bool local_only, const std::string& master_host) {
  static std::mutex mutex;
  static BoundGlooDevice bound;
  std::lock_guard<std::mutex> lock(mutex);
  if (!bound.device) {
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    // Resolving the master may block on DNS: only when the interface is not given.
    const std::string towards_master = ifname || local_only ? "" : detail::local_address_towards(master_host);
    if (ifname) {
      bound = {compat::gloo_device_for_interface(ifname), "interface " + std::string(ifname)};
    } else if (local_only) {
      bound = {compat::gloo_device_for_hostname("127.0.0.1"), "127.0.0.1"};
    } else if (!towards_master.empty()) {
      bound = {compat::gloo_device_for_hostname(towards_master), towards_master};
    } else {
      bound = {compat::gloo_default_device(), "the address this host's name resolves to"};
    }
  }
  return bound;
}

// FSDPP_TIMEOUT_SECONDS (set by `fsdpp-run --timeout S`, or by hand under torchrun) bounds
// the rendezvous and every collective of the job, over what the program asked for, so an
// operator can bound a job without rebuilding it. Unset: the program's timeout (30 min default).
std::chrono::milliseconds timeout_from(std::chrono::milliseconds option) {
  const char* value = std::getenv("FSDPP_TIMEOUT_SECONDS");
  if (!value || !*value) return option;
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  if (*end != '\0' || !(seconds > 0 && seconds <= 1e7))  // also rejects NaN
    throw Error("environment variable FSDPP_TIMEOUT_SECONDS='" + std::string(value) +
                "' is not a number of seconds in (0, 1e7]");
  return std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
}

bool check_collectives_from(std::optional<bool> option) {
  if (option) return *option;
  const char* env = std::getenv("FSDPP_CHECK_COLLECTIVES");
  return !(env && std::string(env) == "0");
}

struct Rendezvous {
  int rank = -1;
  int world_size = -1;
  c10::intrusive_ptr<c10d::Store> store;
  bool local_only = true;
  std::string master_host;  // of a TCP rendezvous: where the other nodes are reached from
  std::string description;  // where the ranks meet, for error messages
};

// The options' rank and world size, else RANK and WORLD_SIZE (required when `required`), checked.
void resolve_rank(const InitProcessGroupOptions& o, bool required, const std::string& why, Rendezvous& r) {
  r.rank = o.rank() >= 0 ? o.rank() : env_int("RANK", -1, required, why);
  r.world_size = o.world_size() >= 0 ? o.world_size() : env_int("WORLD_SIZE", -1, required, why);
  if (r.rank < 0 || r.world_size < 1)
    throw Error("init_process_group needs a rank and a world size (got rank " + std::to_string(r.rank) +
                ", world size " + std::to_string(r.world_size) + ")");
  if (r.rank >= r.world_size)
    throw Error("rank " + std::to_string(r.rank) + " is outside a world of size " + std::to_string(r.world_size));
}

// The fake backend meets nobody: the rank and world size it plays, and a store of its own
// (PyTorch's FakeStore) unless one is given.
Rendezvous fake_rendezvous(const InitProcessGroupOptions& o) {
  Rendezvous r;
  resolve_rank(o, /*required=*/true, "backend 'fake' plays the rank and world size given in the options or in RANK and WORLD_SIZE", r);
  r.store = o.store();
  if (!r.store) r.store = c10::make_intrusive<c10d::HashStore>();
  r.description = "nowhere (backend 'fake')";
  return r;
}

Rendezvous rendezvous(const InitProcessGroupOptions& o, std::chrono::milliseconds timeout) {
  Rendezvous r;
  const std::string env_why = "init_method env:// needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as torchrun sets them";
  const bool from_env = !o.store() && o.init_method() == "env://";
  if (from_env && o.rank() < 0 && o.world_size() < 0) use_slurm_environment();  // srun started the ranks
  resolve_rank(o, from_env || o.store(), env_why, r);

  if (o.store()) {
    r.store = o.store();
    r.description = "the given store";
    return r;
  }
  std::string host;
  int port = 0;
  if (o.init_method() == "env://") {
    host = env_string("MASTER_ADDR", env_why);
    port = parse_port(env_string("MASTER_PORT", env_why), "environment variable MASTER_PORT");
  } else if (o.init_method().rfind("tcp://", 0) == 0) {
    std::string rest = o.init_method().substr(6);
    auto colon = rest.rfind(':');
    if (colon == std::string::npos) throw Error("init_method '" + o.init_method() + "' lacks a port (tcp://host:port)");
    host = rest.substr(0, colon);
    port = parse_port(rest.substr(colon + 1), "init_method port");
  } else if (o.init_method().rfind("file://", 0) == 0) {
    std::string path = o.init_method().substr(7);
    if (path.empty()) throw Error("init_method '" + o.init_method() + "' names no file");
    r.store = c10::make_intrusive<c10d::FileStore>(path, r.world_size);
    r.store->setTimeout(timeout);
    r.description = o.init_method();
    return r;
  } else {
    throw Error("init_method '" + o.init_method() + "' is not env://, tcp://host:port or file:///path");
  }
  r.local_only = is_loopback(host);
  r.master_host = host;
  r.description = "tcp://" + host + ":" + std::to_string(port);
  // Under torchrun the agent already serves the store on MASTER_PORT: every rank is a client,
  // under the attempt's prefix, as PyTorch's own init_process_group does.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool use_agent_store = o.init_method() == "env://" && agent_store && std::string(agent_store) == "True";
  c10d::TCPStoreOptions store_options = compat::tcp_store_options();
  store_options.port = static_cast<std::uint16_t>(port);
  store_options.isServer = r.rank == 0 && !use_agent_store;
  store_options.numWorkers = r.world_size;
  // wait_for_members waits for the ranks within what is left of the timeout, naming the
  // missing ones; the store's own wait would spend a whole timeout first and name nobody.
  store_options.waitWorkers = false;
  store_options.timeout = timeout;
  const char* secret = std::getenv(kStoreSecretVariable);
  if (secret && !store_secret_problem(secret).empty()) throw Error(store_secret_problem(secret));
  if (store_options.isServer)
    store_options.masterListenFd = detail::store_listen_socket(host, port, o.init_method() == "env://");
  try {
    r.store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
    if (secret)  // every key under it, the ranks' and the launchers'
      r.store = c10::make_intrusive<c10d::PrefixStore>(store_secret_prefix(secret), r.store);
    if (use_agent_store) {
      const std::string attempt = std::getenv("TORCHELASTIC_RESTART_COUNT") ? std::getenv("TORCHELASTIC_RESTART_COUNT") : "0";
      r.store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + attempt, r.store);
    }
  } catch (const std::exception& e) {
    throw Error("rendezvous of " + std::to_string(r.world_size) + " ranks at " + r.description + " failed at rank " +
                std::to_string(r.rank) + " within " + std::to_string(timeout.count()) + " ms" +
                (store_options.isServer ? "" : " (rank 0 serves the store there)") + ": " + message_without_backtrace(e));
  }
  return r;
}

// Every member checks in on the store under `stage` and waits, within the timeout, for the
// others, so a rank that never arrives is named (Gloo's own rendezvous would wait its fixed
// 5 minutes).
void wait_for_members(const detail::ProcessGroupImpl& g, const c10::intrusive_ptr<c10d::Store>& store,
                      const std::string& stage, std::chrono::milliseconds timeout) {
  auto key = [&](int rank) { return stage + "/" + std::to_string(rank); };
  store->set(key(g.rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < g.size(); ++r) keys.push_back(key(r));
  try {
    store->wait(keys, timeout);
  } catch (const std::exception& e) {
    const std::string what = "rendezvous of " + g.where() + " with ranks " + list_ranks(g.ranks) +
                             " did not complete within " + std::to_string(g.timeout.count()) + " ms: ";
    std::vector<int> missing;
    try {
      for (int r = 0; r < g.size(); ++r)
        if (!store->check({key(r)})) missing.push_back(g.ranks[r]);
      store->set(stage + "/named/" + std::to_string(g.rank), std::vector<uint8_t>{1});
      // Global rank 0 may serve the store (TCP): it stays up, briefly, until the ranks that
      // arrived have named the missing ones, or they would find no store to ask.
      if (g.global_rank == 0) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        for (int r = 0; r < g.size(); ++r)
          while (store->check({key(r)}) && !store->check({stage + "/named/" + std::to_string(r)}) &&
                 std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
      // The store's server (rank 0 of a TCP store) may have timed out and exited first.
      throw Error(what + "the store became unreachable before the missing ranks could be named");
    }
    throw Error(what + "rank(s) " + list_ranks(missing) + " did not arrive");
  }
}

// PyTorch's switch for c10d's NCCL Work: the host waits for each device collective.
bool torch_nccl_blocking_wait() {
  const char* v = std::getenv("TORCH_NCCL_BLOCKING_WAIT");
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "true");
}

// Connects this process to the other members through a Gloo process group.
// `arrival` bounds the wait for the members to arrive: what is left of the timeout.
void connect(detail::ProcessGroupImpl& g, bool local_only, std::chrono::milliseconds arrival,
             const std::string& master_host = "") {
  if (device_backend_of(g.backend_name) == DeviceBackend::kFake) {  // no peers to wait for or connect to
    g.fake = true;
    g.backend = g.device_backend = detail::make_fake_backend(g.rank, g.size());
    g.c10d_group = detail::fake_process_group(g.backend, g.store);
    return;
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fsdpp/" + g.name + "/", g.store);
  wait_for_members(g, prefixed, "arrived", arrival);
  const BoundGlooDevice bound = gloo_device(local_only, master_host);
  try {
    g.backend = compat::make_gloo_backend(prefixed, g.rank, g.size(), g.timeout, bound.device);
  } catch (const std::exception& e) {
    // The address a rank advertises is what its peers dial: a loopback one on a multi-node
    // job is the usual cause (GLOO_SOCKET_IFNAME picks the interface).
    throw Error("connecting " + g.where() + " with ranks " + list_ranks(g.ranks) + " failed: " + message_without_backtrace(e) +
                " (this rank listens on " + bound.address + (std::getenv("GLOO_SOCKET_IFNAME") ? "" : "; GLOO_SOCKET_IFNAME is unset") + ")");
  }
  // As PyTorch's store-based barrier: nobody leaves before everyone is connected, or a rank
  // that finishes early would close connections a peer is still setting up.
  wait_for_members(g, prefixed, "connected", g.timeout);
  const DeviceBackend device = device_backend_of(g.backend_name);
  const bool nccl = device == DeviceBackend::kNccl;
  if (device == DeviceBackend::kNcclContract) {
    g.device_backend = detail::make_nccl_contract_backend(
        c10::make_intrusive<c10d::PrefixStore>("nccl-contract/", prefixed), g.rank, g.size(), g.name, bound.device);
    g.cpu_tensors_on_device_path = true;
  } else {
    g.device_backend = nccl ? compat::make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("nccl/", prefixed),
                                                        g.rank, g.size(), g.timeout)
                            : g.backend;
  }
  g.device_launches_on_issue = nccl || device == DeviceBackend::kNcclContract;
  g.blocking_wait = torch_nccl_blocking_wait();
  g.c10d_group = compat::as_process_group(g.backend, prefixed, nccl ? g.device_backend : g.backend, nccl);
}

// A child of `parent` over the sorted global `ranks`, named `name`: connected, with its comm
// thread, on its members (every member makes it alike); an empty handle of it elsewhere.
ProcessGroup make_child(const detail::ProcessGroupImpl& parent, std::string name, std::vector<int> ranks) {
  auto child = std::make_shared<detail::ProcessGroupImpl>();
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
    connect(*child, /*local_only=*/false, child->timeout);
    child->comm_thread = std::make_unique<detail::CommThread>();
  }
  return ProcessGroup(std::move(child));
}

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

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks) const {
  const auto& parent = impl();
  if (ranks.empty()) throw Error("new_group: the list of ranks is empty");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i && sorted[i] == sorted[i - 1]) throw Error("new_group: rank " + std::to_string(sorted[i]) + " is listed twice");
    if (std::find(parent.ranks.begin(), parent.ranks.end(), sorted[i]) == parent.ranks.end())
      throw Error("new_group: rank " + std::to_string(sorted[i]) + " is outside group " + parent.name + " " +
                  list_ranks(parent.ranks));
  }
  return make_child(parent, parent.name + "/" + std::to_string(parent.next_child++), std::move(sorted));
}

namespace {
// Python ignores SIGPIPE, so PyTorch's ranks meet a dead peer's closed socket as an error (EPIPE)
// that names it, never as a signal; a C++ process would die of one (Gloo writes to its peers,
// when it shuts a group down too). Left alone when the program installed its own handler.
void ignore_sigpipe_as_python_does() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}
}  // namespace

ProcessGroup init_process_group(const InitProcessGroupOptions& options) {
  device_backend_of(options.backend());  // a misspelt backend fails before the rendezvous
  ignore_sigpipe_as_python_does();
  // One deadline for the whole rendezvous: store, arrival of every rank.
  const std::chrono::milliseconds timeout = timeout_from(options.timeout());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - std::chrono::steady_clock::now()));
  };
  const bool fake = device_backend_of(options.backend()) == DeviceBackend::kFake;
  Rendezvous r = fake ? fake_rendezvous(options) : rendezvous(options, timeout);
  auto g = std::make_shared<detail::ProcessGroupImpl>();
  g->name = "world";
  g->backend_name = options.backend();
  g->store = r.store;
  g->ranks.resize(r.world_size);
  for (int i = 0; i < r.world_size; ++i) g->ranks[i] = i;
  g->global_rank = r.rank;
  g->rank = r.rank;
  g->timeout = timeout;
  g->check_collectives = check_collectives_from(options.check_collectives());
  g->store->setTimeout(timeout);
  connect(*g, r.local_only, left(), r.master_host);
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

int get_local_rank() { return env_int("LOCAL_RANK", 0, false, ""); }
int get_local_world_size() { return env_int("LOCAL_WORLD_SIZE", 1, false, ""); }

}  // namespace fsdpp

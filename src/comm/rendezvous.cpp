// The rendezvous and the members' store-based barrier (rendezvous.h).
#include "comm/rendezvous.h"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <fsdpp/error.h>
#include <fsdpp/slurm_environment.h>

#include "comm/error_message.h"
#include "comm/process_group_impl.h"
#include "comm/process_setup.h"
#include "comm/store_socket.h"
#include "common/host_port.h"
#include "common/loopback.h"
#include "common/store_secret.h"
#include "compat/tcp_store_options.h"

namespace fsdpp::detail {
namespace {

std::string env_string(const char* name, const std::string& why) {
  const char* value = std::getenv(name);
  if (!value || !*value) throw Error("environment variable " + std::string(name) + " is not set (" + why + ")");
  return value;
}

int parse_port(const std::string& text, const std::string& source) {
  const std::optional<int> port = parse_tcp_port(text);
  if (!port) throw Error(source + "='" + text + "' is not a valid TCP port (1-65535)");
  return *port;
}

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

}  // namespace

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
    const std::string rest = o.init_method().substr(6);
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos) throw Error("init_method '" + o.init_method() + "' lacks a port (tcp://host:port)");
    port = parse_port(rest.substr(colon + 1), "init_method port");
    const std::optional<HostPort> address = split_host_port(rest);
    if (!address) throw Error("init_method '" + o.init_method() + "' names no host (tcp://host:port)");
    host = address->host;
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
    store_options.masterListenFd = store_listen_socket(host, port, o.init_method() == "env://");
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

void wait_for_members(const ProcessGroupImpl& g, const c10::intrusive_ptr<c10d::Store>& store,
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

}  // namespace fsdpp::detail

// A group's connection to its members (group_connection.h).
#include "comm/group_connection.h"

#include <cstdlib>
#include <mutex>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <fsdpp/error.h>

#include "comm/device_backend.h"
#include "comm/error_message.h"
#include "comm/fake_backend.h"
#include "comm/local_address.h"
#include "comm/nccl_contract_backend.h"
#include "comm/process_group_impl.h"
#include "comm/process_setup.h"
#include "comm/rendezvous.h"
#include "compat/c10d_backend.h"
#include "compat/cuda_runtime.h"

namespace fsdpp::detail {
namespace {

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
    const std::string towards_master = ifname || local_only ? "" : local_address_towards(master_host);
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

}  // namespace

void connect_group(ProcessGroupImpl& g, bool local_only, std::chrono::milliseconds arrival,
                   const std::string& master_host) {
  if (device_backend_of(g.backend_name) == DeviceBackend::kFake) {  // no peers to wait for or connect to
    g.fake = true;
    g.backend = g.device_backend = make_fake_backend(g.rank, g.size());
    g.c10d_group = fake_process_group(g.backend, g.store);
    return;
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("fsdpp/" + g.name + "/", g.store);
  wait_for_members(g, prefixed, "arrived", arrival);
  const BoundGlooDevice bound = gloo_device(local_only, master_host);
  const DeviceBackend device = device_backend_of(g.backend_name);
  const bool nccl = device == DeviceBackend::kNccl;
  try {
    g.backend = compat::make_gloo_backend(prefixed, g.rank, g.size(), g.timeout, bound.device);
    // The NCCL contract's own communicator is a second Gloo mesh over the same device.
    if (device == DeviceBackend::kNcclContract) {
      g.device_backend = make_nccl_contract_backend(
          c10::make_intrusive<c10d::PrefixStore>("nccl-contract/", prefixed), g.rank, g.size(), g.name, bound.device);
      g.cpu_tensors_on_device_path = true;
    }
  } catch (const std::exception& e) {
    // The address a rank advertises is what its peers dial: a loopback one on a multi-node
    // job is the usual cause (GLOO_SOCKET_IFNAME picks the interface).
    throw Error("connecting " + g.where() + " with ranks " + list_ranks(g.ranks) + " failed: " + message_without_backtrace(e) +
                " (this rank listens on " + bound.address + (std::getenv("GLOO_SOCKET_IFNAME") ? "" : "; GLOO_SOCKET_IFNAME is unset") + ")");
  }
  // As PyTorch's store-based barrier: nobody leaves before every mesh of the group is connected
  // on every member, or a rank that finishes early (and drops the group) would close a connection
  // a peer is still setting up ("Connection closed by peer" on the peer).
  wait_for_members(g, prefixed, "connected", g.timeout);
  if (device != DeviceBackend::kNcclContract)
    g.device_backend = nccl ? compat::make_nccl_backend(c10::make_intrusive<c10d::PrefixStore>("nccl/", prefixed),
                                                        g.rank, g.size(), g.timeout)
                            : g.backend;
  g.device_launches_on_issue = nccl || device == DeviceBackend::kNcclContract;
  g.blocking_wait = torch_nccl_blocking_wait();
  g.c10d_group = compat::as_process_group(g.backend, prefixed, nccl ? g.device_backend : g.backend, nccl);
}

}  // namespace fsdpp::detail

#pragma once
// The socket rank 0's TCPStore listens on. c10d's own listens on every interface, so any machine
// that reaches the port could set keys in a job's rendezvous; a job meeting on loopback keeps it
// on loopback. Private to fsdpp.
#include <optional>
#include <string>

namespace fsdpp::detail {

// A listening socket for the store at host:port (the caller passes it to TCPStoreOptions'
// masterListenFd, which takes it over), or nullopt to let c10d listen on every interface:
// for a loopback `host`: fsdpp-run's own socket (FSDPP_STORE_LISTEN_FD, a single-node job on a
// free loopback port; taken once) when `from_launcher`, else a socket bound to `host` only.
// Throws fsdpp::Error naming host:port when the port cannot be had (another job holds it).
std::optional<int> store_listen_socket(const std::string& host, int port, bool from_launcher);

}  // namespace fsdpp::detail

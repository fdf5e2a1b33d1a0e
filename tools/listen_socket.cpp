// Listening sockets fsdpp-run opens for a store: the single-node job's on loopback, and the
// elastic rendezvous store's on the endpoint's own address (c10d's listens on every interface).
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "launcher.h"

namespace fsdpp_run {

int listen_on(const std::string& address, int port, int& bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || found == nullptr) {
    errno = EADDRNOTAVAIL;
    return -1;
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int error = errno;
  if (fd >= 0) {
    const int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // a restarted launcher rebinds at once
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      freeaddrinfo(found);
      bound_port = ntohs(addr.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                                                   : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
      return fd;
    }
    error = errno;
    close(fd);
  }
  freeaddrinfo(found);
  errno = error;
  return -1;
}

}  // namespace fsdpp_run

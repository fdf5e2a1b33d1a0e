#pragma once
// Which of this host's addresses other nodes reach it by. Private to fsdpp.
#include <string>

namespace fsdpp::detail {

// The local address the kernel would send from to reach `host` (a name or an IPv4/IPv6
// address): the address of the interface whose route leads to it. Nothing is sent (a UDP
// socket is connected, not used). "" if `host` does not resolve or no route leads to it.
std::string local_address_towards(const std::string& host);

}  // namespace fsdpp::detail

#pragma once
// How a group's members connect once they have met: the Gloo backend every group has, on the
// process's one Gloo device, and the backend that carries its CUDA tensors (NCCL, the
// NCCL-contract double, or Gloo itself), or the fake backend's stand-ins. Private to fsdpp.
#include <chrono>
#include <string>

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Connects this process to the other members of `g` (whose name, backend name, store, ranks,
// rank and timeout are set) and fills in its backends and c10d group. `arrival` bounds the wait
// for the members to arrive: what is left of the rendezvous's timeout. `local_only` and
// `master_host` (the world's rendezvous) choose the address the process's Gloo device binds, the
// first time a group connects.
void connect_group(ProcessGroupImpl& g, bool local_only, std::chrono::milliseconds arrival,
                   const std::string& master_host = "");

}  // namespace fsdpp::detail

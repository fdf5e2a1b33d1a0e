#pragma once
// What a rank says when one of its collectives times out: the collective (kind, sequence
// number, sizes, group) and which members had not arrived, learnt from the store, as
// PyTorch's flight recorder dumps on a NCCL timeout. Private to fsdpp.
#include <cstdint>
#include <exception>
#include <string>

namespace fsdpp::detail {

struct ProcessGroupImpl;

// True when `e`, thrown by a Gloo or c10d wait, is a timeout rather than a broken connection.
bool is_timeout(const std::exception& e);

// Called on the comm thread after collective `seq` of `g` (described by `description`)
// timed out: posts `seq` under this member's key on the store, gives the other members a
// grace period (min(timeout, 5 s)) to post theirs, prints one line to stderr,
//   fsdpp: collective timeout: <description> waited 10 s; rank(s) [2] had not arrived (...)
// and returns the text for the error this rank throws:
//   timed out after 10 s; rank(s) [2] had not arrived (...)
// Store trouble (a stopped rank 0 serving it) never extends the wait past the grace period.
// Only the first timeout of a process waits and prints; later ones (the rest of a broken
// group's queue) return at once.
std::string report_hang(const ProcessGroupImpl& g, int64_t seq, const std::string& description);

}  // namespace fsdpp::detail

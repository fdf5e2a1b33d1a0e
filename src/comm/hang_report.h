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

// True when another member of `g` has reported a timeout in collective `seq` (asked of the
// store for up to 1 s). Gloo closes a group's connections when its wait times out, so a
// member whose own wait has not yet timed out sees "Connection closed by peer" instead.
bool peer_timed_out(const ProcessGroupImpl& g, int64_t seq);

// Called on the comm thread after collective `seq` of `g` (described by `description`) timed
// out here (`own_timeout`) or was cut off by a peer's timeout: posts `seq` under this
// member's key on the store, gives the other members a grace period (min(timeout, 5 s)) to
// post theirs, prints one line to stderr,
//   fsdpp: collective timeout: <description>: timed out after 10 s; rank(s) [2] had not
//   arrived (ranks [0, 1, 3] were waiting in it)
// and returns the text after the description, for the error this rank throws. Store trouble
// (a stopped rank 0 serving it) never extends the wait past the grace period. The caller
// reports only the first failure of a group (ProcessGroupImpl::failed).
std::string report_hang(const ProcessGroupImpl& g, int64_t seq, const std::string& description, bool own_timeout);

}  // namespace fsdpp::detail

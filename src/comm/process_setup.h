#pragma once
// What init_process_group reads from the process and sets on it, beside the rendezvous: the
// environment variables that tune every group (fsdpp's and PyTorch's), and SIGPIPE's disposition.
// Private to fsdpp.
#include <chrono>
#include <optional>
#include <string>

namespace fsdpp::detail {

// An integer environment variable; `fallback` when unset (an error saying `why` it is needed
// when `required`), an error naming it when malformed.
int env_int(const char* name, int fallback, bool required, const std::string& why);

// FSDPP_TIMEOUT_SECONDS (set by `fsdpp-run --timeout S`, or by hand under torchrun) bounds
// the rendezvous and every collective of the job, over what the program asked for, so an
// operator can bound a job without rebuilding it. Unset: the program's timeout (30 min default).
std::chrono::milliseconds timeout_from(std::chrono::milliseconds option);

// The option when given, else FSDPP_CHECK_COLLECTIVES (on unless "0").
bool check_collectives_from(std::optional<bool> option);

// PyTorch's switch for c10d's NCCL Work: the host waits for each device collective.
bool torch_nccl_blocking_wait();

// Python ignores SIGPIPE, so PyTorch's ranks meet a dead peer's closed socket as an error (EPIPE)
// that names it, never as a signal; a C++ process would die of one (Gloo writes to its peers,
// when it shuts a group down too). Left alone when the program installed its own handler.
void ignore_sigpipe_as_python_does();

}  // namespace fsdpp::detail

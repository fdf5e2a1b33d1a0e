#pragma once
// Submitting a validated collective to its group's comm thread, and tracing it: numbering (for
// messages and the intent check), CommDebugMode's byte count and the profiler's records happen
// here, once for every collective, so that the public functions (comm/collectives.cpp) only
// validate and describe, and the algorithms (comm/collective_algorithms.h) only exchange.
// Private to fsdpp.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include <fsdpp/work.h>

#include "comm/collective_intent.h"
#include "comm/device_handoff.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// What a collective sends, for CommDebugMode (comm/wire_bytes.h): known when it is issued, or
// only when it ends (broadcast_bytes: only the root knows the size before the exchange), or not
// counted (fsdpp's own metadata collectives, comm/metadata_collectives.h).
struct SentBytes {
  static SentBytes at_issue(int64_t bytes) { return SentBytes{bytes, {}}; }
  static SentBytes at_end(std::function<int64_t()> bytes) { return SentBytes{-1, std::move(bytes)}; }
  static SentBytes uncounted() { return SentBytes{-1, {}}; }
  int64_t issued = -1;  // -1: not known at issue
  std::function<int64_t()> ended;
};

// Numbers the collective, counts what it sends into CommDebugMode (at issue, on the calling
// thread, or when `run` ends, failed or not, on the thread that ran it: `sent`) and records
// its issue on the calling thread; on the
// group's comm thread then waits for `after` (a chained collective; outside its span of the
// timeline), checks `intent` across ranks when the group's check_collectives is on, and runs
// `run`. `what` describes its arguments in messages: "all_reduce(<what>) #3 on group world
// (rank 0 of 2)". Waits for it unless `async_op`. A collective on the device path passes its
// `handoff` (comm/device_handoff.h), which `run` runs within: under NCCL's contract on this
// thread, now, in program order. Its intent check then still runs on the comm thread (which owns
// the group's Gloo backend) without the launch waiting for it; a disagreement is printed there
// and thrown by the group's next collective.
Work submit(const ProcessGroupImpl& g, CollectiveKind kind, CollectiveIntent intent, SentBytes sent,
            const std::string& what, bool async_op, std::function<void()> run, Work after = Work(),
            DeviceHandoff handoff = DeviceHandoff());

}  // namespace fsdpp::detail

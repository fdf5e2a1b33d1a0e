#pragma once
// Submitting a validated collective to its group's comm thread, and tracing it: numbering (for
// messages and the intent check), CommDebugMode's byte count and the profiler's records happen
// here, once for every collective, so that the public functions (comm/collectives.cpp) only
// validate and describe, and the algorithms (comm/collective_algorithms.h) only exchange.
// Private to fsdpp.
#include <cstdint>
#include <functional>
#include <string>

#include <fsdpp/work.h>

#include "comm/collective_intent.h"
#include "comm/device_handoff.h"

namespace fsdpp::detail {

struct ProcessGroupImpl;

// Numbers the collective, counts `bytes_sent` into CommDebugMode (a negative count: `run`
// counts it itself when the size is known) and records its issue on the calling thread; on the
// group's comm thread then waits for `after` (a chained collective; outside its span of the
// timeline), checks `intent` across ranks when the group's check_collectives is on, and runs
// `run`. `what` describes its arguments in messages: "all_reduce(<what>) #3 on group world
// (rank 0 of 2)". Waits for it unless `async_op`. A collective on the device path passes its
// `handoff` (comm/device_handoff.h), which `run` runs within: under NCCL's contract on this
// thread, now, in program order. Its intent check then still runs on the comm thread (which owns
// the group's Gloo backend) without the launch waiting for it; a disagreement is printed there
// and thrown by the group's next collective.
Work submit(const ProcessGroupImpl& g, CollectiveKind kind, CollectiveIntent intent, int64_t bytes_sent,
            const std::string& what, bool async_op, std::function<void()> run, Work after = Work(),
            DeviceHandoff handoff = DeviceHandoff());

}  // namespace fsdpp::detail

#pragma once
// The streams of one FSDP tree's collectives (FSDP2's FSDPCommContext): the root's lazy init
// gives every unit of the tree the root's, and each unit's all-gather and gradient reduction name
// the stream they run on (fsdp_collectives), so the engine says where each step runs rather than
// leaning on a current stream set below it. A stream is made on the device of the first
// collective that takes the device path (comm/device_handoff.h): a tree on the CPU over Gloo
// makes none. Private to fsdpp.
#include "comm/device_stream.h"

namespace fsdpp::detail {

struct FSDPCommContext {
  CommStream all_gather;      // the gathers, and CPU offload's copy in before each
  CommStream reduce_scatter;  // the reduce-scatters, and CPU offload's copy back after each
  CommStream all_reduce;      // HSDP's replicate all-reduce, after its reduce-scatter
};

}  // namespace fsdpp::detail

#pragma once
// The "fake" backend: PyTorch's init_process_group("fake", store=FakeStore(), rank=r,
// world_size=n). One process is rank r of n with no rendezvous and no peers. A fake group runs
// its collectives as any group does (validated, numbered and counted by CommDebugMode at n, run
// in issue order on its comm thread, accelerator ones under its device stream after the issuing
// stream's mark), and only the exchange is a no-op: inputs unchanged, outputs left as they are,
// the Work complete. So one process shows rank r of n's threading, streams, events, buffer
// lifetimes and message sizes, never its numbers. Private to fsdpp.
#include <chrono>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "compat/c10d_backend.h"

namespace fsdpp::detail {

// A c10d backend of rank `rank` of `size` whose collectives complete at once and touch no
// tensor (c10d's own FakeProcessGroup copies all-gather inputs into the outputs, and its 2.15
// header includes Python's), and the c10d::ProcessGroup over it for CPU and CUDA tensors that a
// fake group's ProcessGroup::backend() hands out.
c10::intrusive_ptr<compat::C10dBackend> make_fake_backend(int rank, int size);
c10::intrusive_ptr<c10d::ProcessGroup> fake_process_group(const c10::intrusive_ptr<compat::C10dBackend>& backend,
                                                          const c10::intrusive_ptr<c10d::Store>& store);

// What a fake group's collective runs instead of its exchange, on the comm thread (under the
// group's device stream for an accelerator tensor `on`; undefined for barrier and
// broadcast_bytes): nothing, or the testing delay below.
void run_fake_exchange(const at::Tensor& on);

// A testing knob, as PyTorch's test_fully_shard_overlap patches its collectives with a delayed
// one: from now on every fake collective takes `duration`, a sleep kernel on the group's device
// stream for accelerator tensors (so the overlap of communication with compute shows in time),
// a sleep of the comm thread otherwise. Zero (the default) takes none. Process-wide: every fake
// group, subgroups included.
void set_fake_collective_duration(std::chrono::microseconds duration);

}  // namespace fsdpp::detail

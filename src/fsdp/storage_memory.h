#pragma once
// The one place FSDP frees and reallocates a tensor's memory behind its storage. The unsharded
// flat keeps one storage for the unit's life (the parameters, and the views autograd saved in
// forward, point into it), so resharding empties that storage instead of dropping the tensor,
// and unsharding refills it. A collective's buffers are freed the same way, on the comm thread,
// while its closure still holds a handle.
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fsdpp::detail {

// A tensor of `numel` elements whose storage holds no memory yet.
at::Tensor unallocated(int64_t numel, const at::TensorOptions& options);
// Gives a tensor whose memory was released (or never allocated) the bytes its sizes need.
void allocate_storage(const at::Tensor& t);
// Frees a tensor's memory now, even while other handles to its storage live on; on a device,
// once the work this thread's current stream has queued so far is done.
void release_storage(const at::Tensor& t);

}  // namespace fsdpp::detail

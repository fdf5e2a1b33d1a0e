#include "fsdp/storage_memory.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include "comm/device_stream.h"

namespace fsdpp::detail {

at::Tensor unallocated(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (storage->nbytes() == nbytes) return;
  // A device's allocator allocates on the thread's current device: the tensor's must be.
  c10::OptionalDeviceGuard on_device;
  if (!t.is_cpu()) on_device.reset_device(t.device());
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

void release_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  at::DataPtr freed = storage->set_data_ptr(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
  // A device's caching allocator hands a freed block to the next allocation on the stream it was
  // allocated on (a gather's: the all-gather stream) at once; the work this thread's current
  // stream queued that reads it may not have run yet, so the block waits for it (record_stream,
  // as FSDP1 does; a CPU comm stream holds it, comm/device_stream.h).
  release_after_stream(std::move(freed), current_stream(t.device()));
}

}  // namespace fsdpp::detail

#include "fsdp/storage_memory.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

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
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

void release_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  // A device's caching allocator hands a freed block to the next allocation on the stream it
  // was allocated on (a gather's: the comm thread's) at once; the kernels this thread queued that
  // read it may not have run yet, so the block waits for them (record_stream, as FSDP1 does).
  if (!t.is_cpu() && storage->data_ptr().get() != nullptr) {
    const c10::impl::VirtualGuardImpl device(t.device().type());
    device.recordDataPtrOnStream(storage->data_ptr(), device.getStream(t.device()));
  }
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

}  // namespace fsdpp::detail

#pragma once
// Building modules on the meta device, and giving a meta tensor data in place. libtorch's
// IncludeDispatchKeyGuard cannot make a meta scope: factories dispatch through BackendSelect,
// which takes the backend from the options and ignores included keys, and 2.6's guard leaves
// the Meta backend bit included when it ends (removing a key clears only its functionality
// bit), so every later op ran on meta. Hence the whole thread-local key set is saved and
// restored here. Tested on 2.6 and 2.15 (tests/dist/test_deferred_init.cpp).
#include <cstdint>

#include <ATen/core/Tensor.h>

namespace fsdpp::compat {

// While alive, every tensor this thread creates (factories and ops alike) is a meta tensor.
class MetaDeviceScope {
 public:
  MetaDeviceScope();
  ~MetaDeviceScope();
  MetaDeviceScope(const MetaDeviceScope&) = delete;
  MetaDeviceScope& operator=(const MetaDeviceScope&) = delete;

 private:
  uint64_t saved_included_ = 0, saved_excluded_ = 0;
};

// Makes the meta tensor `meta` hold `data` (its dtype, any shape, on a real device) without
// replacing its TensorImpl, so a module's member and its registered parameter stay one
// tensor and requires_grad is kept. Tensor::set_data refuses a meta-to-real change.
void give_meta_tensor_data(const at::Tensor& meta, const at::Tensor& data);
// The same with uninitialized memory of its shape and dtype on `device` (PyTorch's to_empty).
void give_meta_tensor_memory(const at::Tensor& meta, const at::Device& device = at::kCPU);

}  // namespace fsdpp::compat

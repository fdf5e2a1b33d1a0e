// Where storage_memory (src/fsdp/storage_memory.h) allocates a device tensor's memory: on the
// tensor's device, whatever device the calling thread has current (a caching allocator allocates
// on the current one). Shown without a GPU on a stand-in accelerator of two devices
// (PrivateUse1): its guard keeps a current device per thread, and its allocator records the
// device current at each allocation. What it cannot show: CUDA's allocator itself.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "fsdp/storage_memory.h"

namespace fsdpp {
namespace {

constexpr auto kStandIn = c10::DeviceType::PrivateUse1;

thread_local c10::DeviceIndex t_current = 0;

struct StandInGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kStandIn; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old(kStandIn, t_current);
    t_current = d.index();
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kStandIn, t_current); }
  void setDevice(c10::Device d) const override { t_current = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current = d.index(); }
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  // None reported: autograd's engine would start a thread per device of every registered
  // accelerator in the other tests' processes. Guards do not ask.
  c10::DeviceIndex deviceCount() const noexcept override { return 0; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, StandInGuard);

// Memory from the host, labelled with the device current when it was asked for.
struct StandInAllocator final : c10::Allocator {
  std::vector<c10::DeviceIndex> allocated_on;
  c10::DataPtr allocate(size_t n) override {
    allocated_on.push_back(t_current);
    void* p = std::malloc(n ? n : 1);
    return {p, p, &std::free, c10::Device(kStandIn, t_current)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &std::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

// A float tensor of `numel` elements on stand-in device `index`, its storage empty (as the
// unsharded flat between gathers).
at::Tensor empty_on(c10::DeviceIndex index, int64_t numel, StandInAllocator& allocator) {
  c10::DeviceGuard on(c10::Device(kStandIn, index));
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &allocator, /*resizable=*/true);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<float>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return t;
}

TEST(StorageMemory, AllocatesOnTheTensorsDeviceNotTheCurrentOne) {
  StandInAllocator allocator;
  at::Tensor t = empty_on(1, 64, allocator);
  ASSERT_EQ(t.device(), c10::Device(kStandIn, 1));
  t_current = 0;  // the calling thread's current device is another one
  allocator.allocated_on.clear();
  detail::allocate_storage(t);
  ASSERT_EQ(allocator.allocated_on.size(), 1u);
  EXPECT_EQ(static_cast<int>(allocator.allocated_on[0]), 1) << "allocated on the current device, not the tensor's";
  EXPECT_EQ(static_cast<int>(t_current), 0) << "the current device was not restored";
  EXPECT_EQ(t.storage().nbytes(), 64 * sizeof(float));
  detail::release_storage(t);
  EXPECT_EQ(t.storage().nbytes(), 0u);
}

}  // namespace
}  // namespace fsdpp

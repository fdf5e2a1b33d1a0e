#pragma once
// The c10::Allocator base fsdpp's counting allocator derives from: libtorch's allocator interface
// (non-const `allocate`, a `copy_data` used by Allocator::clone) behind one virtual of fsdpp's.
#include <c10/core/Allocator.h>

namespace fsdpp::compat {

class CPUAllocatorBase : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocate_bytes(nbytes); }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }

 protected:
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;
};

}  // namespace fsdpp::compat

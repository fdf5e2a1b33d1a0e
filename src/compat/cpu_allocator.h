#pragma once
// A c10::Allocator base that compiles on both libtorch lines: 1.13 declares `allocate` const,
// 2.x non-const and also requires `copy_data` (used by Allocator::clone).
#include <c10/core/Allocator.h>

#include "compat/torch_version.h"

namespace fsdpp::compat {

class CPUAllocatorBase : public c10::Allocator {
 public:
#if FSDPP_LIBTORCH_2
  c10::DataPtr allocate(size_t nbytes) override { return allocate_bytes(nbytes); }
  void copy_data(void* dest, const void* src, size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t nbytes) const override { return allocate_bytes(nbytes); }
#endif

 protected:
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;
};

}  // namespace fsdpp::compat

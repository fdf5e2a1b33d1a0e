// compat/cuda_runtime.h against a CPU-only libtorch (Debian's): no device, and what needs one
// says that this libfsdpp was built without CUDA.
#include "compat/cuda_runtime.h"

#include <fsdpp/error.h>

namespace fsdpp::compat {
namespace {

[[noreturn]] void no_cuda(const std::string& what) {
  throw Error(what + " needs CUDA, and this libfsdpp was built against a libtorch without CUDA");
}

}  // namespace

bool built_with_cuda() { return false; }

int cuda_device_count() { return 0; }

c10::intrusive_ptr<C10dBackend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                  std::chrono::milliseconds) {
  no_cuda("backend 'nccl'");
}

void shutdown_nccl_backend(const c10::intrusive_ptr<C10dBackend>&) {}

CudaAllocatorStats cuda_allocator_stats(c10::DeviceIndex) { no_cuda("memory_stats() of a CUDA device"); }

void cuda_reset_peak_stats(c10::DeviceIndex) { no_cuda("reset_peak_memory_stats() of a CUDA device"); }

void cuda_empty_cache() {}

void cuda_sleep(std::chrono::microseconds) { no_cuda("a CUDA sleep kernel"); }

}  // namespace fsdpp::compat

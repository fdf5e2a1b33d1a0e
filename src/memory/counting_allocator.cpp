// fsdpp's CPU allocator: 64-byte aligned blocks (as c10's default), counters of live and peak
// bytes, and a cache of freed blocks (memory/block_cache.h) that holds at most the highest live
// total seen. It replaces the default CPU allocator when libfsdpp loads (a higher registration
// priority).
#include <fsdpp/error.h>
#include <fsdpp/memory.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <string>

#include <c10/util/Exception.h>

#include <c10/core/CPUAllocator.h>

#include "compat/cpu_allocator.h"
#include "memory/allocator_caching.h"
#include "memory/block_cache.h"
#include "memory/out_of_memory_record.h"
#include "memory/peak_since_mark.h"
#include "profiler/timeline.h"

// Under AddressSanitizer a cached block's data is poisoned, so a use after free is still reported.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define FSDPP_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define FSDPP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define FSDPP_POISON(p, n) ((void)(p), (void)(n))
#define FSDPP_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace fsdpp {
namespace {

std::atomic<int64_t> g_current{0};
std::atomic<int64_t> g_peak{0};
std::atomic<int64_t> g_peak_since_mark{0};
std::atomic<int64_t> g_allocations{0};
std::atomic<int64_t> g_high_water{0};  // never reset: bounds the cache
std::atomic<int64_t> g_limit{0};       // 0: none

// Never destroyed: tensors freed during static destruction still reach it.
detail::CPUBlockCache& cache() {
  static auto* c = new detail::CPUBlockCache(/*fork_safe=*/true);
  return *c;
}

// The block's size lives in a header in front of the data, so the raw deleter can find it;
// the header is one alignment unit so the data stays 64-byte aligned.
constexpr size_t kHeader = 64;

void raise_to(std::atomic<int64_t>& peak, int64_t now) {
  int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

void count(int64_t delta) {
  int64_t now = g_current.fetch_add(delta) + delta;
  // Each sample is a value current_bytes took, so the samples' maximum is the peak.
  if (profiler::detail::recording_memory()) profiler::detail::record_memory(now);
  raise_to(g_peak, now);
  raise_to(g_peak_since_mark, now);
  raise_to(g_high_water, now);
}

void release(void* data) {
  if (!data) return;
  char* block = static_cast<char*>(data) - kHeader;
  int64_t size = *reinterpret_cast<int64_t*>(block);
  count(-size);
  if (!detail::NoCachingScope::active()) {
    FSDPP_POISON(data, size);
    if (cache().keep(block, static_cast<size_t>(size), g_high_water.load())) return;
    FSDPP_UNPOISON(data, size);
  }
  std::free(block);
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// Under a limit, checking and counting an allocation are one step for all threads (the main
// thread, the comm thread, autograd's and OpenMP's may allocate at once).
std::mutex g_limit_mutex;

// Guarded by g_limit_mutex, as the check that fills it.
detail::OutOfMemoryRecord g_last_out_of_memory;

// Throws unless `asked` more live bytes stay within `limit`.
void check_limit(int64_t limit, int64_t asked) {
  const int64_t in_use = g_current.load();
  if (in_use + asked <= limit) return;
  g_last_out_of_memory = {g_last_out_of_memory.count + 1, asked, in_use, limit};
  throw c10::OutOfMemoryError(
      c10::SourceLocation{__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
      "CPU out of memory under fsdpp's memory limit: tried to allocate " + mib(asked) + " (" +
          std::to_string(asked) + " bytes) with " + std::to_string(in_use) + " bytes in use and a limit of " +
          std::to_string(limit) + " bytes (" + mib(limit) + ", fsdpp::set_memory_limit)");
}

class CountingCPUAllocator final : public compat::CPUAllocatorBase {
 public:
  c10::DataPtr allocate_bytes(size_t nbytes) const override {
    const int64_t limit = g_limit.load();
    std::unique_lock<std::mutex> limited(g_limit_mutex, std::defer_lock);
    if (limit > 0) {
      limited.lock();
      check_limit(limit, static_cast<int64_t>(nbytes));
    }
    void* raw = cache().take(nbytes);
    // As CUDA's caching allocator: a new block that would take live + cached past the limit
    // first frees the cached ones (a reused block adds nothing to what the process holds).
    if (!raw && limit > 0 && g_current.load() + cache().cached_bytes() + static_cast<int64_t>(nbytes) > limit)
      cache().clear();
    if (raw) FSDPP_UNPOISON(static_cast<char*>(raw) + kHeader, nbytes);
    else if (posix_memalign(&raw, kHeader, nbytes + kHeader) != 0) {
      cache().clear();  // out of memory: what the cache holds first, then try again
      if (posix_memalign(&raw, kHeader, nbytes + kHeader) != 0) throw std::bad_alloc();
    }
    char* block = static_cast<char*>(raw);
    *reinterpret_cast<int64_t*>(block) = static_cast<int64_t>(nbytes);
    count(static_cast<int64_t>(nbytes));
    g_allocations.fetch_add(1);
    void* data = block + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
};

CountingCPUAllocator g_allocator;

long long current_bytes() { return g_current.load(); }

// Priority 1 beats c10's default registration (0) whichever runs first. The profiler's memory
// counter starts from current_bytes (it does not read this layer itself).
const bool g_installed = (c10::SetCPUAllocator(&g_allocator, /*priority=*/1),
                          profiler::detail::set_memory_source(&current_bytes), true);

}  // namespace

MemoryStats memory_stats() {
  (void)g_installed;
  return {g_current.load(), g_peak.load(), g_allocations.load(), cache().cached_bytes()};
}

void empty_cache() { cache().clear(); }

void set_allocator_caching(bool enabled) { cache().set_enabled(enabled); }

void reset_peak_memory_stats() { g_peak.store(g_current.load()); }

namespace detail {
int64_t peak_bytes_since_mark() { return g_peak_since_mark.load(); }
void mark_peak_bytes() { g_peak_since_mark.store(g_current.load()); }
OutOfMemoryRecord last_out_of_memory() {
  std::lock_guard<std::mutex> lock(g_limit_mutex);
  return g_last_out_of_memory;
}
}  // namespace detail

void set_memory_limit(int64_t bytes) {
  if (bytes < 0) throw Error("set_memory_limit: " + std::to_string(bytes) + " bytes; 0 means none");
  g_limit.store(bytes);
}

int64_t memory_limit() { return g_limit.load(); }

}  // namespace fsdpp

#include "memory/block_cache.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>

namespace fsdpp::detail {

CPUBlockCache::CPUBlockCache(bool fork_safe) {
  if (!fork_safe) return;
  // A child forked while another thread holds the lock would deadlock on its first large
  // allocation; hold it across fork, as glibc does for malloc's own locks.
  static CPUBlockCache* forked = this;
  pthread_atfork([] { forked->mutex_.lock(); }, [] { forked->mutex_.unlock(); }, [] { forked->mutex_.unlock(); });
}

void* CPUBlockCache::take(size_t nbytes) {
  if (nbytes < kMinBytes) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = by_size_.find(nbytes);
  if (it == by_size_.end() || it->second.empty()) return nullptr;
  auto block = it->second.back();
  it->second.pop_back();
  void* ptr = block->ptr;
  by_age_.erase(block);
  cached_bytes_ -= static_cast<int64_t>(nbytes);
  return ptr;
}

bool CPUBlockCache::keep(void* block, size_t nbytes, int64_t limit) {
  if (nbytes < kMinBytes) return false;
  std::vector<void*> evicted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto size = static_cast<int64_t>(nbytes);
    if (!enabled_ || size > limit) return false;
    // Called from tensor deleters, which must not throw: without memory for the bookkeeping,
    // the block is not kept.
    try {
      auto& same_size = by_size_[nbytes];
      same_size.reserve(same_size.size() + 1);
      if (cached_bytes_ + size > limit) evicted.reserve(by_age_.size());  // rare: no allocation per free
      while (cached_bytes_ + size > limit) evicted.push_back(evict_oldest());
      same_size.push_back(by_age_.insert(by_age_.end(), Block{block, nbytes}));
      cached_bytes_ += size;
    } catch (...) {
      block = nullptr;
    }
  }
  for (void* p : evicted) std::free(p);  // outside the lock: other threads need not wait
  return block != nullptr;
}

void* CPUBlockCache::evict_oldest() {
  const Block oldest = by_age_.front();
  auto& same_size = by_size_[oldest.nbytes];
  same_size.erase(std::find(same_size.begin(), same_size.end(), by_age_.begin()));
  by_age_.pop_front();
  cached_bytes_ -= static_cast<int64_t>(oldest.nbytes);
  return oldest.ptr;
}

void CPUBlockCache::clear() {
  std::list<Block> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    all.swap(by_age_);
    by_size_.clear();
    cached_bytes_ = 0;
  }
  for (const Block& b : all) std::free(b.ptr);
}

void CPUBlockCache::set_enabled(bool enabled) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    enabled_ = enabled;
  }
  if (!enabled) clear();
}

int64_t CPUBlockCache::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

}  // namespace fsdpp::detail

#include "memory/block_cache.h"

#include <algorithm>
#include <cstdlib>

namespace fsdpp::detail {

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
  std::lock_guard<std::mutex> lock(mutex_);
  const auto size = static_cast<int64_t>(nbytes);
  if (!enabled_ || size > limit) return false;
  while (cached_bytes_ + size > limit) evict_oldest();
  by_size_[nbytes].push_back(by_age_.insert(by_age_.end(), Block{block, nbytes}));
  cached_bytes_ += size;
  return true;
}

void CPUBlockCache::evict_oldest() {
  const Block oldest = by_age_.front();
  auto& same_size = by_size_[oldest.nbytes];
  same_size.erase(std::find(same_size.begin(), same_size.end(), by_age_.begin()));
  by_age_.pop_front();
  cached_bytes_ -= static_cast<int64_t>(oldest.nbytes);
  std::free(oldest.ptr);
}

void CPUBlockCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!by_age_.empty()) evict_oldest();
  by_size_.clear();
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

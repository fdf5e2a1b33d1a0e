#pragma once
// Code that frees blocks no later allocation will ask for again (the full parameters a unit
// replaces by its shards, a checkpoint's read buffers) returns them to the system instead of
// the allocator's cache, where they would sit unused up to the cache's bound.
namespace fsdpp::detail {

// Blocks freed on this thread while one is alive are not cached.
class NoCachingScope {
 public:
  NoCachingScope();
  ~NoCachingScope();
  NoCachingScope(const NoCachingScope&) = delete;
  NoCachingScope& operator=(const NoCachingScope&) = delete;
  // Whether one is alive on this thread.
  static bool active();
};

}  // namespace fsdpp::detail

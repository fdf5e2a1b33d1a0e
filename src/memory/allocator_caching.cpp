// Its own translation unit, free of libtorch, so the fuzzers' reader library (fuzz/CMakeLists.txt),
// which has no allocator, links code that opens a NoCachingScope.
#include "memory/allocator_caching.h"

namespace fsdpp::detail {
namespace {
thread_local int t_depth = 0;
}  // namespace

NoCachingScope::NoCachingScope() { ++t_depth; }
NoCachingScope::~NoCachingScope() { --t_depth; }
bool NoCachingScope::active() { return t_depth > 0; }

}  // namespace fsdpp::detail

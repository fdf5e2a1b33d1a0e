#pragma once
// A directory of this fuzzer process's own, where an input becomes files for the readers to open
// (they read through file descriptors, as from a real checkpoint). Made on first use under
// $TMPDIR (default /tmp), removed at exit; several fuzzer processes (-jobs) never share one.
#include <cstddef>
#include <cstdint>
#include <string>

namespace fsdpp_fuzz {

const std::string& scratch_dir();
// Replaces scratch_dir()/name with exactly these bytes; returns its path.
std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size);
std::string write_scratch_file(const std::string& name, const std::string& bytes);
// Removes scratch_dir()/name if it exists.
void remove_scratch_file(const std::string& name);

}  // namespace fsdpp_fuzz

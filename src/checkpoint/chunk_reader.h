#pragma once
// Reads a box of a saved tensor from the chunks that overlap it: positioned reads of just
// those byte ranges, checksums checked, into a fresh tensor (the destination is untouched).
#include <map>
#include <string>

#include <fsdpp/checkpoint.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"

namespace fsdpp::checkpoint::detail {

class ChunkReader {
 public:
  // Chunk files are relative to `dir`. With `verify`, whole chunks are read and checked.
  ChunkReader(std::string dir, bool verify) : dir_(std::move(dir)), verify_(verify) {}
  at::Tensor read(const std::string& key, const EntryInfo& entry, const Box& region);

 private:
  const File& file(const std::string& name);
  std::string dir_;
  bool verify_;
  std::map<std::string, File> files_;
};

}  // namespace fsdpp::checkpoint::detail

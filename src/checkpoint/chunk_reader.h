#pragma once
// Reads a box of a saved tensor from the chunks that overlap it: positioned reads of just
// those byte ranges, checksums checked, into a fresh tensor (the destination is untouched).
// The chunks must tile the region exactly, else nothing is read.
#include <map>
#include <string>

#include <fsdpp/checkpoint.h>

#include "checkpoint/file_io.h"
#include "checkpoint/format.h"

namespace fsdpp::checkpoint::detail {

class ChunkReader {
 public:
  // Chunk files are relative to `dir`. With `verify`, whole chunks are read and checked. With
  // `confine`, a chunk's file must lie inside `dir` once links are followed (a checkpoint's
  // must; a plain safetensors file may be a link, as Hugging Face's cache makes them).
  ChunkReader(std::string dir, bool verify, bool confine) : dir_(std::move(dir)), verify_(verify), confine_(confine) {}
  at::Tensor read(const std::string& key, const EntryInfo& entry, const Box& region);
  int64_t bytes_read() const { return bytes_read_; }  // tensor bytes, headers not counted

 private:
  const File& file(const std::string& name);
  std::string dir_;
  bool verify_, confine_;
  std::map<std::string, File> files_;
  int64_t bytes_read_ = 0;
};

}  // namespace fsdpp::checkpoint::detail

// Reading boxes of saved tensors from their chunks.
#include "checkpoint/chunk_reader.h"

#include <fsdpp/error.h>

#include "checkpoint/tiling.h"

namespace fsdpp::checkpoint::detail {

const File& ChunkReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) it = files_.emplace(name, File::open_read(dir_ + "/" + name, confine_ ? dir_ : "")).first;
  return it->second;
}

at::Tensor ChunkReader::read(const std::string& key, const EntryInfo& entry, const Box& region) {
  const at::ScalarType dtype = dtype_from_name(entry.dtype, "tensor '" + key + "'");
  at::Tensor out = at::empty(region.sizes, at::TensorOptions().dtype(dtype));
  if (numel(region.sizes) == 0) return out;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  // Which chunks supply which part of the region; they must tile it (counting elements would
  // let an overlap hide a hole of the same size).
  std::vector<const ChunkInfo*> sources;
  std::vector<Box> parts;
  for (const auto& c : entry.chunks) {
    Box part;
    if (!intersect(Box{c.offsets, c.sizes}, region, part)) continue;
    sources.push_back(&c);
    parts.push_back(std::move(part));
  }
  const TilingProblem problem = check_tiling(region, parts);
  if (problem)
    throw Error("tensor '" + key + "': the checkpoint's chunks do not cover the region " + box_string(region) +
                " exactly: " + describe(problem, region, [&](size_t i) {
                  return "chunk '" + sources[i]->name + "' (" + box_string(Box{sources[i]->offsets, sources[i]->sizes}) + ")";
                }));
  for (size_t i = 0; i < sources.size(); ++i) {
    const ChunkInfo& c = *sources[i];
    const Box chunk{c.offsets, c.sizes};
    const Box& part = parts[i];
    const std::string what = "tensor '" + key + "' (chunk '" + c.name + "')";
    const File& f = file(c.file);
    // Before allocating: a chunk the file does not hold is a truncated file, not a huge buffer.
    if (c.end > f.size())
      throw Error(f.path() + " is truncated: " + what + " needs bytes [" + std::to_string(c.begin) + ", " +
                  std::to_string(c.end) + ") but the file ends at byte " + std::to_string(f.size()));
    // What to read: the whole chunk (to check it), or only the dim-0 rows that overlap, which
    // are contiguous in the chunk's row-major bytes.
    Box span = chunk;
    int64_t begin = c.begin;
    if (!chunk.sizes.empty() && !(verify_ && !c.xxh3_64.empty())) {
      const int64_t row_bytes = numel(chunk.sizes) / chunk.sizes[0] * elem;
      begin += (part.offsets[0] - chunk.offsets[0]) * row_bytes;
      span.offsets[0] = part.offsets[0];
      span.sizes[0] = part.sizes[0];
    }
    at::Tensor piece = at::empty(span.sizes, at::TensorOptions().dtype(dtype));
    const int64_t bytes = piece.numel() * elem;
    f.pread_exact(piece.data_ptr(), bytes, begin, what);
    bytes_read_ += bytes;
    if (verify_ && !c.xxh3_64.empty()) {
      const std::string got = xxh3_hex(piece.data_ptr(), static_cast<size_t>(bytes));
      if (got != c.xxh3_64)
        throw Error(f.path() + ": checksum mismatch in tensor '" + key + "' (chunk '" + c.name + "', bytes [" +
                    std::to_string(c.begin) + ", " + std::to_string(c.end) + ")): expected xxh3 " + c.xxh3_64 +
                    ", got " + got + " (the file is corrupt)");
    }
    view_of(out, region, part).copy_(view_of(piece, span, part));
  }
  return out;
}

}  // namespace fsdpp::checkpoint::detail

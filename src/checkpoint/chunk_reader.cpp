// Reading boxes of saved tensors from their chunks.
#include "checkpoint/chunk_reader.h"

#include <fsdpp/error.h>

namespace fsdpp::checkpoint::detail {

const File& ChunkReader::file(const std::string& name) {
  auto it = files_.find(name);
  if (it == files_.end()) it = files_.emplace(name, File::open_read(dir_ + "/" + name)).first;
  return it->second;
}

at::Tensor ChunkReader::read(const std::string& key, const EntryInfo& entry, const Box& region) {
  const at::ScalarType dtype = dtype_from_name(entry.dtype, "tensor '" + key + "'");
  at::Tensor out = at::empty(region.sizes, at::TensorOptions().dtype(dtype));
  const int64_t wanted = numel(region.sizes);
  if (wanted == 0) return out;
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  int64_t covered = 0;
  for (const auto& c : entry.chunks) {
    const Box chunk{c.offsets, c.sizes};
    Box part;
    if (!intersect(chunk, region, part)) continue;
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
    const File& f = file(c.file);
    f.pread_exact(piece.data_ptr(), bytes, begin, "tensor '" + key + "' (chunk '" + c.name + "')");
    if (verify_ && !c.xxh3_64.empty()) {
      const std::string got = xxh3_hex(piece.data_ptr(), static_cast<size_t>(bytes));
      if (got != c.xxh3_64)
        throw Error(f.path() + ": checksum mismatch in tensor '" + key + "' (chunk '" + c.name + "', bytes [" +
                    std::to_string(c.begin) + ", " + std::to_string(c.end) + ")): expected xxh3 " + c.xxh3_64 +
                    ", got " + got + " (the file is corrupt)");
    }
    view_of(out, region, part).copy_(view_of(piece, span, part));
    covered += numel(part.sizes);
  }
  if (covered != wanted)
    throw Error("tensor '" + key + "': the checkpoint's chunks cover " + std::to_string(covered) + " of the " +
                std::to_string(wanted) + " elements at offsets " + shape_string(region.offsets) + " sizes " +
                shape_string(region.sizes));
  return out;
}

}  // namespace fsdpp::checkpoint::detail

#pragma once
// CRC-32C (Castagnoli), the checksum TFRecord framing uses, and TensorFlow's "masked" form of it.
#include <cstddef>
#include <cstdint>

namespace fsdpp::metrics {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// TFRecord stores the CRC rotated and offset: a CRC of data that itself holds CRCs is then
// not trivially related to them.
inline uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t crc = crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace fsdpp::metrics

#include "metrics/crc32c.h"

#include <array>

namespace fsdpp::metrics {
namespace {

// A byte-at-a-time table: event files are small, so speed does not matter here.
constexpr uint32_t kPolynomial = 0x82f63b78u;  // Castagnoli, bit-reversed

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ bytes[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace fsdpp::metrics

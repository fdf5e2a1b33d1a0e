#include "byte_level.h"

#include <array>
#include <unordered_map>

#include "utf8.h"

namespace fsdpp::tokenizer_detail {
namespace {

struct Tables {
  std::array<std::string, 256> to_unicode;  // byte -> UTF-8 of its character
  std::unordered_map<char32_t, unsigned char> to_byte;

  Tables() {
    // Printable Latin-1 bytes map to themselves; the others, in order, to U+0100, U+0101, ...
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      utf8_append(to_unicode[b], cp);
      to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

void byte_level_encode(std::string_view bytes, std::string& out) {
  const auto& t = tables().to_unicode;
  for (unsigned char b : bytes) out += t[b];
}

bool byte_level_decode(std::string_view token, std::string& out) {
  const auto& t = tables().to_byte;
  const size_t start = out.size();
  size_t i = 0;
  while (i < token.size()) {
    const auto it = t.find(utf8_next(token, i));
    if (it == t.end()) {
      out.resize(start);
      return false;
    }
    out += static_cast<char>(it->second);
  }
  return true;
}

}  // namespace fsdpp::tokenizer_detail

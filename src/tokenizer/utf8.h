#pragma once
// UTF-8 helpers shared by the tokenizers.
#include <string>
#include <string_view>

namespace fsdpp::tokenizer_detail {

// `s` with each ill-formed UTF-8 sequence replaced by U+FFFD, as Python's
// bytes.decode("utf-8", errors="replace") and Rust's String::from_utf8_lossy do: one U+FFFD per
// maximal subpart (a lead byte and the continuation bytes that could still complete it).
std::string utf8_replace_invalid(std::string_view s);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool utf8_is_valid(std::string_view s);

// Length in bytes of the character starting at s[i] of a well-formed string.
inline size_t utf8_char_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// The code point starting at s[i] of a well-formed string; advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);

void utf8_append(std::string& out, char32_t cp);

}  // namespace fsdpp::tokenizer_detail

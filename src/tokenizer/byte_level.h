#pragma once
// GPT-2's byte-to-unicode mapping: each byte becomes a printable character, so a byte-level
// BPE vocabulary is made of ordinary strings ("Ġthe" is " the").
#include <string>
#include <string_view>

namespace fsdpp::tokenizer_detail {

// The regex of the ByteLevel pre-tokenizer when `use_regex` is true (tokenizers' byte_level.rs).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Appends the mapped form of `bytes` to `out`.
void byte_level_encode(std::string_view bytes, std::string& out);

// Appends the bytes behind a mapped token to `out`. Returns false (and appends nothing) when a
// character of `token` is not in the mapping: the ByteLevel decoder then keeps the token as is.
bool byte_level_decode(std::string_view token, std::string& out);

}  // namespace fsdpp::tokenizer_detail

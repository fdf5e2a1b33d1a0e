#pragma once
// A compiled Oniguruma regex. Hugging Face `tokenizers` runs its pre-tokenizer patterns through
// Oniguruma too, so \p{L}, \s, (?i:...) and look-aheads mean exactly the same here.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdpp::tokenizer_detail {

class Regex {
 public:
  // Throws fsdpp::Error naming `where` (file and field) when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [begin, end) byte ranges of the successive non-overlapping matches in `text`
  // (which must be valid UTF-8), as tokenizers' find_iter does. Thread-safe.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  // Whether the pattern matches at the very start of `text`.
  bool matches_at_start(std::string_view text) const;

 private:
  void* regex_;  // OnigRegex, kept out of this header
};

}  // namespace fsdpp::tokenizer_detail

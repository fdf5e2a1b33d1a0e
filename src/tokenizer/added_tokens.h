#pragma once
// tokenizer.json's "added_tokens": strings matched in the text before anything else, as
// tokenizers' AddedVocabulary does. Tokens with normalized=false are found in the raw text
// first; then the text between them is normalized and searched for tokens with
// normalized=true. Each search takes the leftmost match, the longest of those starting there
// (Aho-Corasick's LeftmostLongest), then applies single_word, lstrip and rstrip.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_util.h"
#include "normalizer.h"
#include "regex.h"

namespace fsdpp::tokenizer_detail {

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
};

// A piece of the input: either an added token (id set) or normalized text to pre-tokenize.
struct Segment {
  std::string text;
  std::optional<int64_t> id;
};

class AddedTokens {
 public:
  // `at`: the "added_tokens" array; `normalizer` normalizes the contents of normalized tokens.
  AddedTokens(const JsonAt& at, const Normalizer& normalizer);

  // Splits `text` (valid UTF-8) and normalizes the parts between added tokens.
  std::vector<Segment> split(std::string_view text, const Normalizer& normalizer) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find(std::string_view content) const;
  const AddedToken* find(int64_t id) const;

 private:
  // A byte trie over the tokens' contents.
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> next;
      int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    void insert(std::string_view s, int32_t token);
    // The longest token starting at text[pos]: (index into tokens_, length), or index -1.
    std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;
  };
  void find_matches(std::string_view text, const Trie& trie, std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<std::string, size_t> by_content_;
  std::unordered_map<int64_t, size_t> by_id_;
  Trie raw_trie_, normalized_trie_;
  bool any_normalized_ = false;
  std::unique_ptr<Regex> word_char_;  // Rust's char::is_alphanumeric or '_', for single_word
  std::unique_ptr<Regex> space_char_;  // Rust's char::is_whitespace, for lstrip / rstrip
};

}  // namespace fsdpp::tokenizer_detail

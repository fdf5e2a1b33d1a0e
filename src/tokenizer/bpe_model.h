#pragma once
// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): merges a pre-token's
// characters pairwise, lowest merge rank first, exactly as tokenizers' Word::merge_all.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "json_util.h"

namespace fsdpp::tokenizer_detail {

class BpeModel {
 public:
  // `at`: the "model" field. Refuses dropout, continuing_subword_prefix, end_of_word_suffix and
  // byte_fallback, which no byte-level tokenizer fsdpp targets uses.
  static std::unique_ptr<BpeModel> from_json(const JsonAt& at);

  // Appends the ids of one pre-token (already byte-level mapped). Characters missing from the
  // vocabulary become unk_token's id, or are dropped when there is none, as tokenizers does.
  void tokenize(std::string_view word, std::vector<int64_t>& out) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(int64_t id) const;  // nullptr when not in the vocabulary
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // id -> token ("" for holes)
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // word -> ids of recent words; results do not depend on it.
  static constexpr size_t kCacheCapacity = 20000;
  static constexpr size_t kCacheMaxWord = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace fsdpp::tokenizer_detail

#pragma once
// The interface behind fsdpp::Tokenizer; one implementation per kind of tokenizer file.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp::tokenizer_detail {

class TokenizerImpl {
 public:
  virtual ~TokenizerImpl() = default;
  // `text` is valid UTF-8 (fsdpp::Tokenizer replaces invalid sequences first).
  virtual std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> token_to_id(std::string_view token) const = 0;
  virtual std::string id_to_token(int64_t id) const = 0;

  std::optional<int64_t> bos_id, eos_id, pad_id;
};

}  // namespace fsdpp::tokenizer_detail

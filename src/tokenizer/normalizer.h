#pragma once
// The tokenizer.json normalizers fsdpp supports: none, or Unicode NFC (Qwen2's).
#include <string>
#include <string_view>

#include "json_util.h"

namespace fsdpp::tokenizer_detail {

class Normalizer {
 public:
  Normalizer() = default;
  // `at`: the "normalizer" field (null, {"type": "NFC"}, or a Sequence of those). Other types
  // (NFKC, Lowercase, Replace, Prepend, ...) are refused, naming the file and field.
  static Normalizer from_json(const JsonAt& at);

  bool is_identity() const { return !nfc_; }
  // Valid UTF-8 in, valid UTF-8 out.
  std::string apply(std::string_view text) const;

 private:
  bool nfc_ = false;
};

}  // namespace fsdpp::tokenizer_detail

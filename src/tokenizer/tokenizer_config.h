#pragma once
// The parts of transformers' tokenizer_config.json (and special_tokens_map.json) that decide
// ids: the special tokens' names and whether BOS / EOS are added.
#include <optional>
#include <string>

namespace fsdpp::tokenizer_detail {

struct TokenizerConfig {
  std::string file;  // the config file read, for error messages ("" when there is none)
  std::optional<std::string> bos_token, eos_token, pad_token;
  std::optional<bool> add_bos_token, add_eos_token;

  // Reads `dir`/tokenizer_config.json, then fills the tokens it lacks from
  // `dir`/special_tokens_map.json; either file may be absent.
  static TokenizerConfig load(const std::string& dir);
};

}  // namespace fsdpp::tokenizer_detail

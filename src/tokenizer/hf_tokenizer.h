#pragma once
// A tokenizer.json tokenizer: added tokens, normalizer, pre-tokenizer, BPE model,
// post-processor and decoder, run in the order of Hugging Face tokenizers' encode.
#include <memory>
#include <string>

#include "tokenizer_config.h"
#include "tokenizer_impl.h"

namespace fsdpp::tokenizer_detail {

// Loads `file` (a tokenizer.json); `config` supplies the special tokens and add_bos/eos_token.
std::unique_ptr<TokenizerImpl> load_hf_tokenizer(const std::string& file, const TokenizerConfig& config);

}  // namespace fsdpp::tokenizer_detail

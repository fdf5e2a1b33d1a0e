#pragma once
// A SentencePiece tokenizer.model (Llama 2, Mistral), run by the SentencePiece library itself.
#include <memory>
#include <string>

#include "tokenizer_config.h"
#include "tokenizer_impl.h"

namespace fsdpp::tokenizer_detail {

// BOS is added unless the config's add_bos_token is false, EOS only when add_eos_token is true
// (transformers' LlamaTokenizer defaults). Special tokens: the config's names, else the model's
// own bos/eos/pad ids.
std::unique_ptr<TokenizerImpl> load_sentencepiece(const std::string& file, const TokenizerConfig& config);

}  // namespace fsdpp::tokenizer_detail

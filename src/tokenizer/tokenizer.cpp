// fsdpp::Tokenizer: finds the tokenizer files and hands the work to the implementation.
#include <fsdpp/error.h>
#include <fsdpp/tokenizer.h>

#include <filesystem>

#include "hf_tokenizer.h"
#include "sentencepiece_model.h"
#include "tokenizer_config.h"
#include "utf8.h"

namespace fsdpp {

using tokenizer_detail::TokenizerImpl;

Tokenizer::Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_pretrained(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path file;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.model"}) {
      if (fs::is_regular_file(fs::path(path) / name, ec)) {
        file = fs::path(path) / name;
        break;
      }
    }
    if (file.empty()) throw Error("tokenizer: " + path + " holds neither tokenizer.json nor tokenizer.model");
  } else if (fs::is_regular_file(path, ec)) {
    file = path;
  } else {
    throw Error("tokenizer: " + path + " is neither a directory nor a file");
  }
  const auto config = tokenizer_detail::TokenizerConfig::load(file.parent_path().string());
  if (file.extension() == ".model") {
    return Tokenizer(tokenizer_detail::load_sentencepiece(file.string(), config));
  }
  if (file.extension() == ".json") return Tokenizer(tokenizer_detail::load_hf_tokenizer(file.string(), config));
  throw Error("tokenizer: " + file.string() + " is neither a .json (tokenizer.json) nor a .model (SentencePiece) file");
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (tokenizer_detail::utf8_is_valid(text)) return impl_->encode(text, add_special_tokens);
  return impl_->encode(tokenizer_detail::utf8_replace_invalid(text), add_special_tokens);
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }
std::optional<int64_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }
std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }
std::string Tokenizer::id_to_token(int64_t id) const { return impl_->id_to_token(id); }

}  // namespace fsdpp

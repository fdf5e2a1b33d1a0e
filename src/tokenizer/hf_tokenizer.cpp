#include "hf_tokenizer.h"

#include <fsdpp/error.h>

#include <algorithm>

#include "added_tokens.h"
#include "bpe_model.h"
#include "byte_level.h"
#include "json_util.h"
#include "normalizer.h"
#include "post_processor.h"
#include "pre_tokenizer.h"
#include "utf8.h"

namespace fsdpp::tokenizer_detail {
namespace {

class HfTokenizer final : public TokenizerImpl {
 public:
  HfTokenizer(const std::string& file, const TokenizerConfig& config);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int64_t id) const override;

 private:
  const std::string* token_of(int64_t id) const;

  std::string file_;
  Normalizer normalizer_;
  std::unique_ptr<AddedTokens> added_;
  PreTokenizer pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  PostProcessor post_;
  bool byte_level_decoder_ = false;
  int64_t vocab_size_ = 0;
};

HfTokenizer::HfTokenizer(const std::string& file, const TokenizerConfig& config) : file_(file) {
  const Json json = read_json_file(file);
  const JsonAt root{json, file, ""};
  if (!json.is_object()) root.fail("the file is not a JSON object");
  normalizer_ = Normalizer::from_json(root.child_or_null("normalizer"));
  added_ = std::make_unique<AddedTokens>(root.child_or_null("added_tokens"), normalizer_);
  pre_tokenizer_ = PreTokenizer::from_json(root.child_or_null("pre_tokenizer"));
  model_ = BpeModel::from_json(root.child("model"));
  post_ = PostProcessor::from_json(root.child_or_null("post_processor"));
  if (root.has("decoder")) {
    const JsonAt decoder = root.child("decoder");
    const std::string type = decoder.child("type").string();
    if (type != "ByteLevel") decoder.child("type").fail("decoder type '" + type + "' is not supported (only ByteLevel)");
    byte_level_decoder_ = true;
  }

  vocab_size_ = model_->size();
  for (const AddedToken& t : added_->tokens()) vocab_size_ = std::max(vocab_size_, t.id + 1);

  const auto special = [&](const std::optional<std::string>& name, const char* field) -> std::optional<int64_t> {
    if (!name) return std::nullopt;
    const auto id = token_to_id(*name);
    if (!id) json_fail(config.file, field, "token '" + *name + "' is not in " + file);
    return id;
  };
  bos_id = special(config.bos_token, "bos_token");
  eos_id = special(config.eos_token, "eos_token");
  pad_id = special(config.pad_token, "pad_token");
  // transformers adds BOS / EOS itself when the post-processor does not template them.
  if (!post_.has_template) {
    if (config.add_bos_token.value_or(false)) {
      if (!bos_id) json_fail(config.file, "add_bos_token", "is true but there is no bos_token");
      post_.prefix.insert(post_.prefix.begin(), *bos_id);
    }
    if (config.add_eos_token.value_or(false)) {
      if (!eos_id) json_fail(config.file, "add_eos_token", "is true but there is no eos_token");
      post_.suffix.push_back(*eos_id);
    }
  }
}

std::vector<int64_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) ids = post_.prefix;
  for (const Segment& segment : added_->split(text, normalizer_)) {
    if (segment.id) {
      ids.push_back(*segment.id);
    } else {
      pre_tokenizer_.for_each_piece(segment.text, [&](std::string_view piece) { model_->tokenize(piece, ids); });
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
  return ids;
}

const std::string* HfTokenizer::token_of(int64_t id) const {
  if (const AddedToken* t = added_->find(id)) return &t->content;
  return model_->id_to_token(id);
}

std::string HfTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string* token = token_of(ids[i]);
    if (token == nullptr) {
      throw Error("tokenizer: decode: ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                  " is not an id of " + file_ + " (vocab_size " + std::to_string(vocab_size_) + ")");
    }
    if (skip_special_tokens) {
      const AddedToken* added = added_->find(*token);
      if (added != nullptr && added->special) continue;
    }
    if (byte_level_decoder_) {
      // A token made of mapped bytes gives its bytes; any other (an added token) itself.
      if (!byte_level_decode(*token, bytes)) bytes += *token;
    } else {
      if (!first) bytes += ' ';  // tokenizers joins with spaces when there is no decoder
      bytes += *token;
    }
    first = false;
  }
  return utf8_replace_invalid(bytes);  // tokenizers' String::from_utf8_lossy
}

std::optional<int64_t> HfTokenizer::token_to_id(std::string_view token) const {
  if (const AddedToken* t = added_->find(token)) return t->id;
  return model_->token_to_id(token);
}

std::string HfTokenizer::id_to_token(int64_t id) const {
  const std::string* token = token_of(id);
  if (token == nullptr) {
    throw Error("tokenizer: id_to_token: " + std::to_string(id) + " is not an id of " + file_ + " (vocab_size " +
                std::to_string(vocab_size_) + ")");
  }
  return *token;
}

}  // namespace

std::unique_ptr<TokenizerImpl> load_hf_tokenizer(const std::string& file, const TokenizerConfig& config) {
  return std::make_unique<HfTokenizer>(file, config);
}

}  // namespace fsdpp::tokenizer_detail

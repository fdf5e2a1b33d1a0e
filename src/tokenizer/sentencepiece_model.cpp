#include "sentencepiece_model.h"

#include <fsdpp/error.h>
#include <sentencepiece_processor.h>

#include "json_util.h"

namespace fsdpp::tokenizer_detail {
namespace {

class SentencePieceTokenizer final : public TokenizerImpl {
 public:
  SentencePieceTokenizer(const std::string& file, const TokenizerConfig& config);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<int64_t> token_to_id(std::string_view token) const override;
  std::string id_to_token(int64_t id) const override;

 private:
  void check_id(int64_t id, const char* what) const;

  std::string file_;
  sentencepiece::SentencePieceProcessor sp_;  // its const methods are thread-safe
  bool add_bos_ = true, add_eos_ = false;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& file, const TokenizerConfig& config) : file_(file) {
  const auto status = sp_.Load(file);
  if (!status.ok()) throw Error("tokenizer: cannot load SentencePiece model " + file + ": " + status.ToString());
  add_bos_ = config.add_bos_token.value_or(true);
  add_eos_ = config.add_eos_token.value_or(false);
  const auto special = [&](const std::optional<std::string>& name, int own, const char* field) -> std::optional<int64_t> {
    if (name) {
      const auto id = token_to_id(*name);
      if (!id) json_fail(config.file, field, "token '" + *name + "' is not in " + file);
      return id;
    }
    if (own >= 0) return own;
    return std::nullopt;
  };
  bos_id = special(config.bos_token, sp_.bos_id(), "bos_token");
  eos_id = special(config.eos_token, sp_.eos_id(), "eos_token");
  pad_id = special(config.pad_token, sp_.pad_id(), "pad_token");
  if (add_bos_ && !bos_id) json_fail(config.file, "add_bos_token", "is true but " + file + " has no BOS");
  if (add_eos_ && !eos_id) json_fail(config.file, "add_eos_token", "is true but " + file + " has no EOS");
}

std::vector<int64_t> SentencePieceTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int> pieces;
  const auto status = sp_.Encode(absl::string_view(text.data(), text.size()), &pieces);
  if (!status.ok()) throw Error("tokenizer: SentencePiece " + file_ + " failed to encode: " + status.ToString());
  std::vector<int64_t> ids;
  ids.reserve(pieces.size() + 2);
  if (add_special_tokens && add_bos_) ids.push_back(*bos_id);
  ids.insert(ids.end(), pieces.begin(), pieces.end());
  if (add_special_tokens && add_eos_) ids.push_back(*eos_id);
  return ids;
}

void SentencePieceTokenizer::check_id(int64_t id, const char* what) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error(std::string("tokenizer: ") + what + ": " + std::to_string(id) + " is not an id of " + file_ +
                " (vocab_size " + std::to_string(vocab_size()) + ")");
  }
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], ("decode: ids[" + std::to_string(i) + "]").c_str());
    const int64_t id = ids[i];
    if (skip_special_tokens && (id == bos_id || id == eos_id || id == pad_id || id == sp_.unk_id())) continue;
    kept.push_back(static_cast<int>(id));
  }
  std::string text;
  const auto status = sp_.Decode(kept, &text);
  if (!status.ok()) throw Error("tokenizer: SentencePiece " + file_ + " failed to decode: " + status.ToString());
  return text;
}

std::optional<int64_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = sp_.PieceToId(absl::string_view(token.data(), token.size()));
  // PieceToId answers unk_id for an unknown piece.
  if (id < 0 || sp_.IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::id_to_token(int64_t id) const {
  check_id(id, "id_to_token");
  return sp_.IdToPiece(static_cast<int>(id));
}

}  // namespace

std::unique_ptr<TokenizerImpl> load_sentencepiece(const std::string& file, const TokenizerConfig& config) {
  return std::make_unique<SentencePieceTokenizer>(file, config);
}

}  // namespace fsdpp::tokenizer_detail

#pragma once
// Text tokenizers in C++ that give the same ids as Hugging Face's, id for id.
//
//   auto tok = fsdpp::Tokenizer::from_pretrained("/models/llama3");   // a directory or a file
//   std::vector<int64_t> ids = tok.encode("Hello world");              // [bos, ...]
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// Two kinds of tokenizer:
//  * tokenizer.json with a byte-level BPE model (GPT-2, Llama 3, Qwen2 families): the ids equal
//    those of Hugging Face `tokenizers` (`Tokenizer.encode(text).ids`). Supported pieces:
//    model BPE (merges as "a b" strings or ["a", "b"] pairs, `ignore_merges`, `unk_token`;
//    no dropout, no continuing_subword_prefix / end_of_word_suffix, no byte_fallback);
//    normalizer null or NFC; pre_tokenizer ByteLevel (with or without its GPT-2 regex,
//    `add_prefix_space`) or a Sequence of Split(Regex or String, behavior "Isolated",
//    invert false) and ByteLevel; post_processor null, ByteLevel, TemplateProcessing, or a
//    Sequence of those; decoder ByteLevel (or null); added tokens with `special`,
//    `normalized`, `lstrip`, `rstrip`, `single_word`. Anything else is refused by
//    from_pretrained with an fsdpp::Error naming the file and the field.
//  * tokenizer.model, a SentencePiece model (Llama 2, Mistral): encoding and decoding are
//    the SentencePiece library's own, so ids agree with Python's `sentencepiece` by construction.
//
// tokenizer_config.json (optional, next to the tokenizer file): `bos_token`, `eos_token`,
// `pad_token` (a string or an AddedToken object {"content": ...}) name the special tokens
// behind bos_token_id() / eos_token_id() / pad_token_id(); a SentencePiece model falls back to
// its own bos/eos/pad ids. `add_bos_token` / `add_eos_token`: a SentencePiece model adds BOS
// unless add_bos_token is false and EOS only if add_eos_token is true (transformers'
// LlamaTokenizer defaults). A tokenizer.json whose post_processor adds no tokens (null or
// ByteLevel) gets BOS / EOS added when the config sets add_bos_token / add_eos_token true; with
// a TemplateProcessing post_processor the template alone decides (the config's flags are ignored).
// `clean_up_tokenization_spaces` is not applied: decode() equals `tokenizers`' decode, i.e.
// transformers' decode with clean_up_tokenization_spaces=False.
//
// Text is bytes. Python tokenizers only ever see a `str`, so encode() first replaces each
// invalid UTF-8 sequence by U+FFFD exactly as Python's `raw.decode("utf-8", errors="replace")`
// does (one U+FFFD per maximal subpart of an ill-formed sequence; overlongs, encoded
// surrogates ED A0..ED BF, bytes C0, C1, F5..FF are invalid), then encodes that text.
// decode() of byte-level ids whose bytes are not valid UTF-8 does the same replacement, as the
// `tokenizers` ByteLevel decoder does, so it equals Python's decode(ids) encoded as UTF-8.
// decode() throws on an id outside [0, vocab_size()) (Python drops it silently).
//
// All const methods are thread-safe. Copies share the (immutable) loaded tokenizer.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpp {

namespace tokenizer_detail {
class TokenizerImpl;
}

class Tokenizer {
 public:
  // `path`: a directory holding tokenizer.json (preferred) or tokenizer.model, and optionally
  // tokenizer_config.json; or the tokenizer.json / tokenizer.model file itself (its directory's
  // tokenizer_config.json is then read too).
  static Tokenizer from_pretrained(const std::string& path);

  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  // Number of ids, added tokens included.
  int64_t vocab_size() const;
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  // The id of a token (a vocabulary entry or an added token, as written in the vocabulary:
  // byte-level BPE tokens are in their mapped form, e.g. "Ġthe").
  std::optional<int64_t> token_to_id(std::string_view token) const;
  // The token of an id; throws on an id outside [0, vocab_size()).
  std::string id_to_token(int64_t id) const;

 private:
  explicit Tokenizer(std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl);
  std::shared_ptr<const tokenizer_detail::TokenizerImpl> impl_;
};

}  // namespace fsdpp

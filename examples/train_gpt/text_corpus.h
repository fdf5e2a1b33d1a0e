#pragma once
// The training text as tokens: the file read once and tokenized on every rank (the same tokens
// everywhere), held in memory (4 bytes per token). The last `val_fraction` of the tokens is the
// validation split. Tokens are a Hugging Face tokenizer's (fsdpp::Tokenizer) or the file's bytes
// (vocabulary 256: any text, UTF-8 or not, trains without a tokenizer).
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fsdpp/checkpoint.h>
#include <fsdpp/tokenizer.h>

namespace train_gpt {

class TextTokenizer {
 public:
  // "bytes", or a folder / file fsdpp::Tokenizer::from_pretrained reads.
  static TextTokenizer load(const std::string& source);
  const std::string& source() const { return source_; }
  bool is_bytes() const { return !hf_.has_value(); }
  int64_t vocab_size() const;
  // The text's tokens, without special tokens (a corpus is one long document).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  const fsdpp::Tokenizer* hf() const { return hf_ ? &*hf_ : nullptr; }

 private:
  std::string source_ = "bytes";
  std::optional<fsdpp::Tokenizer> hf_;
};

class TextCorpus {
 public:
  // Throws naming the file when it cannot be read or a split is shorter than a window.
  TextCorpus(const std::string& path, const TextTokenizer& tokenizer, double val_fraction, int64_t window);

  const std::string& path() const { return path_; }
  int64_t text_bytes() const { return text_bytes_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t train_tokens() const { return split_; }
  int64_t val_tokens() const { return size() - split_; }
  // `n` tokens from `offset`.
  std::vector<int64_t> read(int64_t offset, int64_t n) const;
  // Entropy of the training split's token frequencies, in nats per token: the loss of the best
  // model that ignores context.
  double unigram_entropy() const;
  // Start offsets of the validation windows: `count` windows of `window` tokens spread evenly.
  std::vector<int64_t> val_windows(int64_t count, int64_t window) const;

 private:
  std::string path_;
  std::vector<int32_t> tokens_;
  int64_t text_bytes_ = 0, split_ = 0;
};

// The data loader's position: draws each step's windows (start offsets in the training split)
// from its own generator, the same on every rank, which takes its slice. Its state (the
// generator and the batches drawn) is checkpointed through the Stateful protocol, so a resumed
// run draws what the uninterrupted one would have. The global batches do not depend on the world
// size: resumed at another world size, the run sees the same sequences, split over other ranks.
class BatchSampler : public fsdpp::checkpoint::Stateful {
 public:
  BatchSampler(uint64_t seed, int64_t train_tokens, int64_t window);
  std::vector<int64_t> next(int64_t count);
  int64_t batches_drawn() const { return batches_; }
  fsdpp::checkpoint::State state_dict() const override;
  void load_state_dict(const fsdpp::checkpoint::State& state) override;

 private:
  std::mt19937_64 rng_;
  uint64_t range_;
  int64_t batches_ = 0;
};

// This rank's part [begin, end) of `count` items split evenly over `world` ranks.
inline std::pair<int64_t, int64_t> rank_slice(int64_t count, int rank, int world) {
  return {count * rank / world, count * (rank + 1) / world};
}

}  // namespace train_gpt

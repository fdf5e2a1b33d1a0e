#pragma once
// The training text: a file whose bytes are the tokens (vocabulary 256, so any text, UTF-8 or
// not, trains without a tokenizer). The file's last `val_fraction` is the validation split.
// Ranks read only the windows of their own slice of each batch, with positioned reads.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace train_gpt {

class TextCorpus {
 public:
  // Throws naming the file when it cannot be read or a split is shorter than a window.
  TextCorpus(const std::string& path, double val_fraction, int64_t window);
  ~TextCorpus();
  TextCorpus(const TextCorpus&) = delete;
  TextCorpus& operator=(const TextCorpus&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  int64_t train_bytes() const { return split_; }
  int64_t val_bytes() const { return size_ - split_; }
  // `n` bytes from `offset` of the file.
  std::vector<uint8_t> read(int64_t offset, int64_t n) const;
  // Entropy of the training split's byte frequencies, in nats per byte: the loss of the best
  // model that ignores context.
  double unigram_entropy() const;
  // Start offsets of the validation windows: `count` windows of `window` bytes spread evenly.
  std::vector<int64_t> val_windows(int64_t count, int64_t window) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0, split_ = 0;
};

// Draws each step's windows (start offsets in the training split) from its own generator, the
// same on every rank. Its state is part of a checkpoint, so a resumed run draws what the
// uninterrupted one would have.
class BatchSampler {
 public:
  BatchSampler(uint64_t seed, int64_t train_bytes, int64_t window);
  std::vector<int64_t> next(int64_t count);
  std::string state() const;
  void set_state(const std::string& state);

 private:
  std::mt19937_64 rng_;
  uint64_t range_;
};

// This rank's part [begin, end) of `count` items split evenly over `world` ranks.
inline std::pair<int64_t, int64_t> rank_slice(int64_t count, int rank, int world) {
  return {count * rank / world, count * (rank + 1) / world};
}

}  // namespace train_gpt

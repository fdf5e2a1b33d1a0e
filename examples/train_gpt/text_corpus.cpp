#include "text_corpus.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace train_gpt {

TextTokenizer TextTokenizer::load(const std::string& source) {
  TextTokenizer t;
  if (source.empty() || source == "bytes") return t;
  t.source_ = source;
  t.hf_ = fsdpp::Tokenizer::from_pretrained(source);
  return t;
}

int64_t TextTokenizer::vocab_size() const { return hf_ ? hf_->vocab_size() : 256; }

std::vector<int32_t> TextTokenizer::encode(const std::string& text) const {
  if (!hf_) return std::vector<int32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                        reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  const std::vector<int64_t> ids = hf_->encode(text, /*add_special_tokens=*/false);
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string TextTokenizer::decode(const std::vector<int64_t>& ids) const {
  if (hf_) return hf_->decode(ids);
  std::string text;
  for (int64_t id : ids) text.push_back(static_cast<char>(id));
  return text;
}

TextCorpus::TextCorpus(const std::string& path, const TextTokenizer& tokenizer, double val_fraction, int64_t window)
    : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open --data " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw std::runtime_error("reading --data " + path + " failed");
  const std::string bytes = text.str();
  text_bytes_ = static_cast<int64_t>(bytes.size());
  tokens_ = tokenizer.encode(bytes);
  const int64_t n = size();
  split_ = n - static_cast<int64_t>(std::ceil(static_cast<double>(n) * val_fraction));
  if (split_ <= window || n - split_ <= window)
    throw std::runtime_error("--data " + path + " has " + std::to_string(n) + " tokens: the training (" +
                             std::to_string(split_) + ") and validation (" + std::to_string(n - split_) +
                             ") splits must each be longer than a window of " + std::to_string(window) +
                             " tokens (--seq + 1)");
}

std::vector<int64_t> TextCorpus::read(int64_t offset, int64_t n) const {
  return std::vector<int64_t>(tokens_.begin() + offset, tokens_.begin() + offset + n);
}

double TextCorpus::unigram_entropy() const {
  std::unordered_map<int32_t, int64_t> counts;
  for (int64_t i = 0; i < split_; ++i) ++counts[tokens_[static_cast<size_t>(i)]];
  double h = 0;
  for (const auto& [token, c] : counts)
    h -= static_cast<double>(c) / static_cast<double>(split_) * std::log(static_cast<double>(c) / static_cast<double>(split_));
  return h;
}

std::vector<int64_t> TextCorpus::val_windows(int64_t count, int64_t window) const {
  const int64_t last = size() - window;  // the last start that fits
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(split_ + (last - split_) * i / std::max<int64_t>(1, count - 1));
  return starts;
}

BatchSampler::BatchSampler(uint64_t seed, int64_t train_tokens, int64_t window)
    : rng_(seed), range_(static_cast<uint64_t>(train_tokens - window + 1)) {}

std::vector<int64_t> BatchSampler::next(int64_t count) {
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(static_cast<int64_t>(rng_() % range_));
  ++batches_;
  return starts;
}

fsdpp::checkpoint::State BatchSampler::state_dict() const {
  std::ostringstream out;
  out << rng_;
  return {{"rng", fsdpp::checkpoint::Entry::bytes(out.str())}, {"batches_drawn", batches_}};
}

void BatchSampler::load_state_dict(const fsdpp::checkpoint::State& state) {
  std::istringstream in(state.at("rng").to_string());
  in >> rng_;
  if (!in) throw std::runtime_error("the checkpoint's data loader state is not a std::mt19937_64 state");
  batches_ = state.at("batches_drawn").to_int();
}

}  // namespace train_gpt

#include "text_corpus.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace train_gpt {

TextCorpus::TextCorpus(const std::string& path, double val_fraction, int64_t window) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error("cannot open --data " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw std::runtime_error("--data " + path + " is not a regular file");
  }
  size_ = st.st_size;
  split_ = size_ - static_cast<int64_t>(std::ceil(static_cast<double>(size_) * val_fraction));
  if (split_ <= window || size_ - split_ <= window) {
    ::close(fd_);
    throw std::runtime_error("--data " + path + " has " + std::to_string(size_) + " bytes: the training (" +
                             std::to_string(split_) + ") and validation (" + std::to_string(size_ - split_) +
                             ") splits must each be longer than a window of " + std::to_string(window) +
                             " bytes (--seq + 1)");
  }
}

TextCorpus::~TextCorpus() { ::close(fd_); }

std::vector<uint8_t> TextCorpus::read(int64_t offset, int64_t n) const {
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, bytes.data() + done, static_cast<size_t>(n - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      throw std::runtime_error("reading " + std::to_string(n) + " bytes at " + std::to_string(offset) + " of " + path_ +
                               " failed: " + (got == 0 ? std::string("the file shrank") : std::strerror(errno)));
    done += got;
  }
  return bytes;
}

double TextCorpus::unigram_entropy() const {
  std::array<int64_t, 256> counts{};
  const int64_t chunk = 1 << 20;
  for (int64_t at = 0; at < split_; at += chunk)
    for (uint8_t b : read(at, std::min(chunk, split_ - at))) ++counts[b];
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) h -= static_cast<double>(c) / split_ * std::log(static_cast<double>(c) / split_);
  return h;
}

std::vector<int64_t> TextCorpus::val_windows(int64_t count, int64_t window) const {
  const int64_t last = size_ - window;  // the last start that fits
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(split_ + (last - split_) * i / std::max<int64_t>(1, count - 1));
  return starts;
}

BatchSampler::BatchSampler(uint64_t seed, int64_t train_bytes, int64_t window)
    : rng_(seed), range_(static_cast<uint64_t>(train_bytes - window + 1)) {}

std::vector<int64_t> BatchSampler::next(int64_t count) {
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < count; ++i) starts.push_back(static_cast<int64_t>(rng_() % range_));
  return starts;
}

std::string BatchSampler::state() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

void BatchSampler::set_state(const std::string& state) {
  std::istringstream in(state);
  in >> rng_;
  if (!in) throw std::runtime_error("the checkpoint's batch sampler state is not a std::mt19937_64 state");
}

}  // namespace train_gpt

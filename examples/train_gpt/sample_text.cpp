#include "sample_text.h"

#include <random>
#include <stdexcept>

#include <torch/torch.h>

namespace train_gpt {

std::string sample_text(Model& model, const TextTokenizer& tokenizer, int64_t context, const std::string& prompt,
                        int64_t count, uint64_t seed) {
  torch::NoGradGuard no_grad;
  std::vector<int32_t> start = tokenizer.encode(prompt.empty() ? std::string("\n") : prompt);
  std::vector<int64_t> ids(start.begin(), start.end());
  if (ids.empty()) ids.push_back(0);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()), context);
    const at::Tensor tokens = torch::tensor(std::vector<int64_t>(ids.end() - n, ids.end()), torch::kLong).unsqueeze(0);
    // Only the tokenizer's ids: a model's vocabulary may be padded past them (Qwen2.5's is).
    const at::Tensor logits =
        model->forward(tokens)[0][n - 1].narrow(0, 0, tokenizer.vocab_size()).to(torch::kDouble).cpu();
    at::Tensor next = torch::zeros({1}, torch::kLong);
    if (fsdpp::default_group().rank() == 0) {
      const at::Tensor probs = torch::softmax(logits / 0.8, -1).contiguous();
      const double* p = probs.data_ptr<double>();
      const int64_t vocab = probs.numel();
      double u = uniform(rng), acc = 0;
      int64_t pick = vocab - 1;
      for (int64_t t = 0; t < vocab; ++t) {
        acc += p[t];
        if (u < acc) {
          pick = t;
          break;
        }
      }
      next[0] = pick;
    }
    fsdpp::broadcast(next, 0);  // the ranks' logits agree; rank 0's draw decides
    ids.push_back(next.item<int64_t>());
  }
  return tokenizer.decode(ids);
}

std::string printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    // The length of a well-formed UTF-8 sequence starting here, or 0.
    size_t len = byte < 0x80 ? 1 : (byte >> 5) == 0x6 ? 2 : (byte >> 4) == 0xE ? 3 : (byte >> 3) == 0x1E ? 4 : 0;
    for (size_t k = 1; k < len; ++k)
      if (i + k >= text.size() || (static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) len = 0;
    if (len == 0 || (byte < 0x20 && byte != '\n' && byte != '\t')) {
      out.push_back('?');
      ++i;
    } else {
      out.append(text, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace train_gpt

#include "sample_text.h"

#include <random>
#include <stdexcept>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>

namespace train_gpt {

std::string sample_text(const std::string& safetensors_file, const fsdpp::examples::TransformerArgs& args,
                        const std::string& prompt, int64_t count, uint64_t seed) {
  fsdpp::examples::Transformer model(args);
  const auto weights = fsdpp::checkpoint::load_safetensors(safetensors_file);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto it = weights.find(item.key());
    if (it == weights.end()) throw std::runtime_error(safetensors_file + " has no tensor '" + item.key() + "'");
    item.value().copy_(it->second);
  }
  std::string text = prompt.empty() ? std::string("\n") : prompt;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t context = std::min<int64_t>(static_cast<int64_t>(text.size()), args.max_seq_len);
    at::Tensor tokens = torch::empty({1, context}, torch::kLong);
    for (int64_t j = 0; j < context; ++j)
      tokens[0][j] = static_cast<int64_t>(static_cast<uint8_t>(text[text.size() - static_cast<size_t>(context - j)]));
    at::Tensor probs = torch::softmax(model->forward(tokens)[0][context - 1] / 0.8, -1).to(torch::kDouble).contiguous();
    const double* p = probs.data_ptr<double>();
    double u = uniform(rng), acc = 0;
    int next = 255;
    for (int b = 0; b < 256; ++b) {
      acc += p[b];
      if (u < acc) {
        next = b;
        break;
      }
    }
    text.push_back(static_cast<char>(next));
  }
  return text;
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

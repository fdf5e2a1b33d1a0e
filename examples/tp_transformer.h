#pragma once
// transformer.h's transformer, ready for tensor parallelism: its attention and feed-forward
// Linears, the token embedding and the output projection are declared as fsdpp::TensorParallel
// wrappers (libtorch has no forward hooks, so a module its parent calls through a typed member
// must be the wrapper for parallelize_module to reach it; until parallelized it is the plain
// module). Parameter names are transformer.h's, so its state dicts load here and back. The
// attention finds its heads from the width it is given, so a TP rank computes its own heads.
// tp_transformer_plan is PyTorch's Transformer.parallelize plan (common_dtensor.py) without
// sequence parallelism.
#include <cmath>
#include <limits>
#include <string>

#include <torch/torch.h>

#include <fsdpp/tensor_parallel.h>

#include "transformer.h"

namespace fsdpp::examples {

using TPLinear = fsdpp::TensorParallel<torch::nn::LinearImpl>;

class TPAttentionImpl : public torch::nn::Module {
 public:
  TPAttentionImpl(int64_t dim, int64_t n_heads) : head_dim_(dim / n_heads) {
    auto linear = [&](const char* name) {
      return register_module(name, TPLinear(torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false))));
    };
    wq = linear("wq");
    wk = linear("wk");
    wv = linear("wv");
    wo = linear("wo");
  }
  at::Tensor forward(at::Tensor x) {
    const int64_t b = x.size(0), s = x.size(1);
    // Column-wise wq/wk/wv give this rank's heads; the row-wise wo sums over the ranks' heads.
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim_}).transpose(1, 2); };
    at::Tensor q = heads(wq->forward(x)), k = heads(wk->forward(x)), v = heads(wv->forward(x));
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    at::Tensor causal = torch::ones({s, s}, torch::kBool).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    at::Tensor out = torch::matmul(torch::softmax(scores, -1), v);
    return wo->forward(out.transpose(1, 2).reshape({b, s, -1}));
  }
  TPLinear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};

 private:
  int64_t head_dim_;
};
TORCH_MODULE(TPAttention);

class TPFeedForwardImpl : public torch::nn::Module {
 public:
  explicit TPFeedForwardImpl(int64_t dim) {
    w1 = register_module("w1", TPLinear(torch::nn::Linear(dim, 4 * dim)));
    w2 = register_module("w2", TPLinear(torch::nn::Linear(4 * dim, dim)));
  }
  at::Tensor forward(at::Tensor x) { return w2->forward(torch::gelu(w1->forward(x))); }
  TPLinear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(TPFeedForward);

class TPTransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TPTransformerBlockImpl(const TransformerArgs& args) {
    attention_norm = register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    attention = register_module("attention", TPAttention(args.dim, args.n_heads));
    ffn_norm = register_module("ffn_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    feed_forward = register_module("feed_forward", TPFeedForward(args.dim));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = x + attention->forward(attention_norm->forward(x));
    return h + feed_forward->forward(ffn_norm->forward(h));
  }
  torch::nn::LayerNorm attention_norm{nullptr}, ffn_norm{nullptr};
  TPAttention attention{nullptr};
  TPFeedForward feed_forward{nullptr};
};
TORCH_MODULE(TPTransformerBlock);

// No weight tying: a tied output would share the embedding's weight, sharded another way.
class TPTransformerImpl : public torch::nn::Module {
 public:
  explicit TPTransformerImpl(const TransformerArgs& args) {
    tok_embeddings = register_module(
        "tok_embeddings", fsdpp::TensorParallel<torch::nn::EmbeddingImpl>(torch::nn::Embedding(args.vocab_size, args.dim)));
    pos_embeddings = register_module("pos_embeddings", torch::nn::Embedding(args.max_seq_len, args.dim));
    layers = register_module("layers", torch::nn::Sequential());
    for (int64_t i = 0; i < args.n_layers; ++i) layers->push_back(TPTransformerBlock(args));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    output = register_module(
        "output", TPLinear(torch::nn::Linear(torch::nn::LinearOptions(args.dim, args.vocab_size).bias(false))));
  }
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor positions = torch::arange(tokens.size(1), torch::kLong);
    at::Tensor h = tok_embeddings->forward(tokens) + pos_embeddings->forward(positions);
    return output->forward(norm->forward(layers->forward(h)));
  }
  fsdpp::TensorParallel<torch::nn::EmbeddingImpl> tok_embeddings{nullptr};
  torch::nn::Embedding pos_embeddings{nullptr};
  torch::nn::Sequential layers{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  TPLinear output{nullptr};
};
TORCH_MODULE(TPTransformer);

// PyTorch's Transformer.parallelize without sequence parallelism: the token embedding row-wise
// (replicated ids), q/k/v and w1 column-wise, wo and w2 row-wise, the output column-wise and
// gathered (replicated logits); norms and the position embedding stay replicated.
inline fsdpp::ParallelizePlan tp_transformer_plan(int64_t n_layers) {
  fsdpp::ParallelizePlan plan{{"tok_embeddings", fsdpp::RowwiseParallel()},
                              {"output", fsdpp::ColwiseParallel().output_layouts(fsdpp::TPLayout::Replicate)}};
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i) + ".";
    for (const char* name : {"attention.wq", "attention.wk", "attention.wv", "feed_forward.w1"})
      plan.emplace_back(block + name, fsdpp::ColwiseParallel());
    for (const char* name : {"attention.wo", "feed_forward.w2"}) plan.emplace_back(block + name, fsdpp::RowwiseParallel());
  }
  return plan;
}

}  // namespace fsdpp::examples

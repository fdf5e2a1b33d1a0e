#pragma once
// transformer.h's transformer, ready for tensor parallelism: its attention and feed-forward
// Linears, the embeddings, the LayerNorms, the attention itself and the output projection are
// declared as fsdpp::TensorParallel wrappers (libtorch has no forward hooks, so a module its
// parent calls through a typed member must be the wrapper for parallelize_module to reach it;
// until parallelized it is the plain module). Parameter names are transformer.h's, so its state
// dicts load here and back. The attention finds its heads from the width it is given, so a TP
// rank computes its own heads. tp_transformer_plan is PyTorch's Transformer.parallelize plan
// (common_dtensor.py), with or without sequence parallelism.
#include <cmath>
#include <limits>
#include <string>

#include <torch/torch.h>

#include <fsdpp/tensor_parallel.h>

#include "transformer.h"

namespace fsdpp::examples {

using TPLinear = fsdpp::TensorParallel<torch::nn::LinearImpl>;
using TPEmbedding = fsdpp::TensorParallel<torch::nn::EmbeddingImpl>;
using TPLayerNorm = fsdpp::TensorParallel<torch::nn::LayerNormImpl>;

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
  // Under sequence parallelism, x is the whole sequence (PrepareModuleInput gathers it) and wo
  // returns this rank's rows of it.
  at::Tensor forward(at::Tensor x) {
    const int64_t b = x.size(0), s = x.size(1);
    // Column-wise wq/wk/wv give this rank's heads; the row-wise wo sums over the ranks' heads.
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, head_dim_}).transpose(1, 2); };
    at::Tensor q = heads(wq->forward(x)), k = heads(wk->forward(x)), v = heads(wv->forward(x));
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    at::Tensor causal = torch::ones({s, s}, x.options().dtype(torch::kBool)).triu(1);
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
    attention_norm = register_module("attention_norm", TPLayerNorm(torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim}))));
    attention = register_module("attention", fsdpp::TensorParallel<TPAttentionImpl>(TPAttention(args.dim, args.n_heads)));
    ffn_norm = register_module("ffn_norm", TPLayerNorm(torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim}))));
    feed_forward = register_module("feed_forward", TPFeedForward(args.dim));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = x + attention->forward(attention_norm->forward(x));
    return h + feed_forward->forward(ffn_norm->forward(h));
  }
  TPLayerNorm attention_norm{nullptr}, ffn_norm{nullptr};
  fsdpp::TensorParallel<TPAttentionImpl> attention{nullptr};
  TPFeedForward feed_forward{nullptr};
};
TORCH_MODULE(TPTransformerBlock);

// No weight tying: a tied output would share the embedding's weight, sharded another way.
class TPTransformerImpl : public torch::nn::Module {
 public:
  explicit TPTransformerImpl(const TransformerArgs& args) {
    tok_embeddings = register_module("tok_embeddings", TPEmbedding(torch::nn::Embedding(args.vocab_size, args.dim)));
    pos_embeddings = register_module("pos_embeddings", TPEmbedding(torch::nn::Embedding(args.max_seq_len, args.dim)));
    layers = register_module("layers", torch::nn::Sequential());
    for (int64_t i = 0; i < args.n_layers; ++i) layers->push_back(TPTransformerBlock(args));
    norm = register_module("norm", TPLayerNorm(torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim}))));
    output = register_module(
        "output", TPLinear(torch::nn::Linear(torch::nn::LinearOptions(args.dim, args.vocab_size).bias(false))));
  }
  // Under sequence parallelism the embeddings give this rank's rows of the sequence ([b, s_r, d]
  // and [s_r, d]), which the blocks keep, and the output gathers.
  at::Tensor forward(at::Tensor tokens) {
    at::Tensor positions = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
    at::Tensor h = tok_embeddings->forward(tokens) + pos_embeddings->forward(positions);
    return output->forward(norm->forward(layers->forward(h)));
  }
  TPEmbedding tok_embeddings{nullptr}, pos_embeddings{nullptr};
  torch::nn::Sequential layers{nullptr};
  TPLayerNorm norm{nullptr};
  TPLinear output{nullptr};
};
TORCH_MODULE(TPTransformer);

// PyTorch's Transformer.parallelize (common_dtensor.py). Without sequence parallelism: the token
// embedding row-wise (replicated ids), q/k/v and w1 column-wise, wo and w2 row-wise, the output
// column-wise and gathered (replicated logits); norms and the position embedding stay replicated
// (PyTorch also makes the position embedding row-wise with a Replicate output: the same values).
// With it (use_seq_parallel), activations between the blocks' matmuls are sharded along the
// sequence (Shard(1)): the embeddings reduce-scatter their partial sums along the sequence (the
// positions' [s, d] along dim 0), the norms run on their rows (SequenceParallel), the attention
// all-gathers its input (PrepareModuleInput), w1 and the output all-gather theirs
// (input_layouts Shard(1)), wo and w2 reduce-scatter their outputs (output_layouts Shard(1)).
inline fsdpp::ParallelizePlan tp_transformer_plan(int64_t n_layers, bool use_seq_parallel = false) {
  using fsdpp::TPLayout;
  const TPLayout seq = TPLayout::shard(1);
  fsdpp::ParallelizePlan plan;
  if (use_seq_parallel) {
    plan = {{"tok_embeddings", fsdpp::RowwiseParallel().input_layouts(TPLayout::Replicate).output_layouts(seq)},
            {"pos_embeddings",
             fsdpp::RowwiseParallel().input_layouts(TPLayout::Replicate).output_layouts(TPLayout::shard(0))},
            {"norm", fsdpp::SequenceParallel()},
            {"output", fsdpp::ColwiseParallel().input_layouts(seq).output_layouts(TPLayout::Replicate)}};
  } else {
    plan = {{"tok_embeddings", fsdpp::RowwiseParallel()},
            {"output", fsdpp::ColwiseParallel().output_layouts(TPLayout::Replicate)}};
  }
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string block = "layers." + std::to_string(i) + ".";
    if (use_seq_parallel) {
      plan.emplace_back(block + "attention",
                        fsdpp::PrepareModuleInput().input_layouts(seq).desired_input_layouts(TPLayout::Replicate));
      plan.emplace_back(block + "attention_norm", fsdpp::SequenceParallel());
      plan.emplace_back(block + "ffn_norm", fsdpp::SequenceParallel());
    }
    for (const char* name : {"attention.wq", "attention.wk", "attention.wv"})
      plan.emplace_back(block + name, fsdpp::ColwiseParallel());
    plan.emplace_back(block + "feed_forward.w1",
                      use_seq_parallel ? fsdpp::ColwiseParallel().input_layouts(seq) : fsdpp::ColwiseParallel());
    for (const char* name : {"attention.wo", "feed_forward.w2"})
      plan.emplace_back(block + name, use_seq_parallel ? fsdpp::RowwiseParallel().output_layouts(seq)
                                                       : fsdpp::RowwiseParallel());
  }
  return plan;
}

}  // namespace fsdpp::examples

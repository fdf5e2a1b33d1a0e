#pragma once
// A small GPT-style transformer (the shape of PyTorch's FSDP tests' Transformer): token and
// position embeddings, pre-norm blocks of causal self-attention and an MLP, a final norm and
// an output projection, optionally tied to the token embedding. The blocks sit in a
// torch::nn::Sequential, so fsdpp::ModuleWrapPolicy<TransformerBlockImpl> makes each a unit
// without editing this class. Used by the main job, the tests and the benchmarks.
#include <cmath>

#include <torch/torch.h>

namespace fsdpp::examples {

struct TransformerArgs {
  int64_t n_layers = 2;
  int64_t vocab_size = 64;
  int64_t max_seq_len = 16;
  int64_t dim = 16;
  int64_t n_heads = 2;
  bool weight_tying = false;
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(int64_t dim, int64_t n_heads) : n_heads_(n_heads) {
    wq = register_module("wq", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wk = register_module("wk", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wv = register_module("wv", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
    wo = register_module("wo", torch::nn::Linear(torch::nn::LinearOptions(dim, dim).bias(false)));
  }
  at::Tensor forward(at::Tensor x) {
    const int64_t b = x.size(0), s = x.size(1), d = x.size(2), hd = d / n_heads_;
    auto heads = [&](const at::Tensor& t) { return t.view({b, s, n_heads_, hd}).transpose(1, 2); };
    at::Tensor q = heads(wq->forward(x)), k = heads(wk->forward(x)), v = heads(wv->forward(x));
    at::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    at::Tensor causal = torch::ones({s, s}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    at::Tensor out = torch::matmul(torch::softmax(scores, -1), v);
    return wo->forward(out.transpose(1, 2).reshape({b, s, d}));
  }
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};

 private:
  int64_t n_heads_;
};
TORCH_MODULE(Attention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(int64_t dim) {
    w1 = register_module("w1", torch::nn::Linear(dim, 4 * dim));
    w2 = register_module("w2", torch::nn::Linear(4 * dim, dim));
  }
  at::Tensor forward(at::Tensor x) { return w2->forward(torch::gelu(w1->forward(x))); }
  torch::nn::Linear w1{nullptr}, w2{nullptr};
};
TORCH_MODULE(FeedForward);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TransformerBlockImpl(const TransformerArgs& args) {
    attention_norm = register_module("attention_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    attention = register_module("attention", Attention(args.dim, args.n_heads));
    ffn_norm = register_module("ffn_norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    feed_forward = register_module("feed_forward", FeedForward(args.dim));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = x + attention->forward(attention_norm->forward(x));
    return h + feed_forward->forward(ffn_norm->forward(h));
  }
  torch::nn::LayerNorm attention_norm{nullptr}, ffn_norm{nullptr};
  Attention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(TransformerBlock);

// The output projection; with weight tying it registers the token embedding's weight as its
// own "weight" (one tensor under two names, as Python's `output.weight = tok_embeddings.weight`).
class OutputProjectionImpl : public torch::nn::Module {
 public:
  OutputProjectionImpl(int64_t dim, int64_t vocab_size, at::Tensor tied_weight = {}) {
    if (!tied_weight.defined()) tied_weight = torch::nn::Linear(torch::nn::LinearOptions(dim, vocab_size).bias(false))->weight;
    weight = register_parameter("weight", tied_weight);
  }
  at::Tensor forward(at::Tensor h) { return torch::nn::functional::linear(h, weight); }
  // As torch::nn::Linear initializes its weight (for fsdpp::materialize_module).
  void reset_parameters() { torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0)); }
  at::Tensor weight;
};
TORCH_MODULE(OutputProjection);

// fsdpp::MaterializeOptions::param_init_fn for this transformer: the one module of its own with
// parameters (the rest are libtorch modules, which fsdpp initializes itself).
inline bool init_transformer_module(torch::nn::Module& module) {
  auto* output = dynamic_cast<OutputProjectionImpl*>(&module);
  if (output) output->reset_parameters();
  return output != nullptr;
}

// The transformer's two ends, as functions its forward and the stage modules below share.
inline at::Tensor embed_tokens(torch::nn::EmbeddingImpl& tok_embeddings, torch::nn::EmbeddingImpl& pos_embeddings,
                               const at::Tensor& tokens) {
  at::Tensor positions = torch::arange(tokens.size(1), tokens.options().dtype(torch::kLong));
  return tok_embeddings.forward(tokens) + pos_embeddings.forward(positions);
}
inline at::Tensor project_output(torch::nn::LayerNormImpl& norm, OutputProjectionImpl& output, const at::Tensor& h) {
  return output.forward(norm.forward(h));
}

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const TransformerArgs& args) {
    tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(args.vocab_size, args.dim));
    pos_embeddings = register_module("pos_embeddings", torch::nn::Embedding(args.max_seq_len, args.dim));
    layers = register_module("layers", torch::nn::Sequential());
    for (int64_t i = 0; i < args.n_layers; ++i) layers->push_back(TransformerBlock(args));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({args.dim})));
    output = register_module("output", OutputProjection(args.dim, args.vocab_size,
                                                        args.weight_tying ? tok_embeddings->weight : at::Tensor()));
  }
  // tokens (batch, seq) -> logits (batch, seq, vocab)
  at::Tensor forward(at::Tensor tokens) {
    return project_output(*norm, *output, layers->forward(embed_tokens(*tok_embeddings, *pos_embeddings, tokens)));
  }
  torch::nn::Embedding tok_embeddings{nullptr}, pos_embeddings{nullptr};
  torch::nn::Sequential layers{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  OutputProjection output{nullptr};
};
TORCH_MODULE(Transformer);

// The same transformer as a Sequential of stages (the same modules and parameter tensors):
// embeddings, the blocks, then norm and output projection, so that an auto-wrap policy can make
// the two ends units of their own, as torchtitan shards tok_embeddings and [norm, output]
// (fsdpp::ModuleWrapPolicy<TransformerEmbeddingsImpl, TransformerBlockImpl, TransformerHeadImpl>).
// Without weight tying: tied, the two ends share a parameter and must be one unit.
class TransformerEmbeddingsImpl : public torch::nn::Module {
 public:
  TransformerEmbeddingsImpl(torch::nn::Embedding tok, torch::nn::Embedding pos) {
    tok_embeddings = register_module("tok_embeddings", tok);
    pos_embeddings = register_module("pos_embeddings", pos);
  }
  at::Tensor forward(at::Tensor tokens) { return embed_tokens(*tok_embeddings, *pos_embeddings, tokens); }
  torch::nn::Embedding tok_embeddings{nullptr}, pos_embeddings{nullptr};
};
TORCH_MODULE(TransformerEmbeddings);

class TransformerHeadImpl : public torch::nn::Module {
 public:
  TransformerHeadImpl(torch::nn::LayerNorm n, OutputProjection out) {
    norm = register_module("norm", n);
    output = register_module("output", out);
  }
  at::Tensor forward(at::Tensor h) { return project_output(*norm, *output, h); }
  torch::nn::LayerNorm norm{nullptr};
  OutputProjection output{nullptr};
};
TORCH_MODULE(TransformerHead);

inline torch::nn::Sequential transformer_stages(const Transformer& model) {
  TORCH_CHECK(!model->output->weight.is_same(model->tok_embeddings->weight),
              "transformer_stages: the output projection is tied to the token embedding");
  torch::nn::Sequential stages(TransformerEmbeddings(model->tok_embeddings, model->pos_embeddings));
  for (const auto& block : *model->layers) stages->push_back(block);
  stages->push_back(TransformerHead(model->norm, model->output));
  return stages;
}

// Mean next-token cross-entropy of logits (batch, seq, vocab) against targets (batch, seq).
inline at::Tensor language_model_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

// Model FLOPs of one token's forward and backward, for the MFU (PaLM's appendix B): 6 per
// parameter (2 forward, 4 backward) plus attention's scores and values, 12 x layers x dim x seq.
inline double training_flops_per_token(const TransformerArgs& args, int64_t parameters) {
  return 6.0 * static_cast<double>(parameters) +
         12.0 * static_cast<double>(args.n_layers * args.dim * args.max_seq_len);
}

}  // namespace fsdpp::examples

// The Llama decoder, computed as transformers' LlamaForCausalLM (modeling_llama.py) computes it.
#include <cmath>

#include <ATen/ATen.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <fsdpp/error.h>
#include <fsdpp/llama.h>
#include <fsdpp/wrap_policy.h>

namespace fsdpp {

namespace {

LlamaLinear linear(int64_t in, int64_t out, bool bias) {
  return LlamaLinear(torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias)));
}

// transformers' _compute_default_rope_parameters and _compute_llama3_parameters, op for op.
at::Tensor inverse_frequencies(const LlamaConfig& c, at::Device device) {
  const int64_t dim = c.attention_head_dim();
  at::Tensor exponents = at::arange(0, dim, 2, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::pow(c.rope_theta, exponents).reciprocal();
  if (!c.rope_scaling) return inv_freq;
  const Llama3RopeScaling& s = *c.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  at::Tensor smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  at::Tensor medium = (wavelen < high_freq_wavelen).logical_not() & (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x: (batch, heads, seq, head_dim); cos, sin: (seq, head_dim).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// The LM head: a bias-free Linear whose weight may be the embedding's (tied).
class LlamaLMHeadImpl : public torch::nn::Module {
 public:
  explicit LlamaLMHeadImpl(at::Tensor weight) { this->weight = register_parameter("weight", std::move(weight)); }
  at::Tensor forward(const at::Tensor& h) { return torch::nn::functional::linear(h, weight); }
  at::Tensor weight;
};

}  // namespace

std::pair<at::Tensor, at::Tensor> llama_rotary_tables(const LlamaConfig& config, int64_t seq_len, at::Device device) {
  at::Tensor inv_freq = inverse_frequencies(config, device);
  at::Tensor positions = at::arange(seq_len, at::TensorOptions().dtype(at::kLong).device(device)).to(at::kFloat);
  // transformers' matmul of (head_dim / 2, 1) by (1, seq) is these products, computed in float32
  // whatever autocast says.
  at::Tensor freqs = positions.unsqueeze(1) * inv_freq.unsqueeze(0);  // (seq, head_dim / 2)
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps_);
  return weight * h.to(x.scalar_type());
}

void LlamaRMSNormImpl::reset_parameters() {
  at::NoGradGuard no_grad;
  weight.fill_(1);
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config) : config_(config) {
  const int64_t hd = config.attention_head_dim();
  const int64_t h = config.hidden_size;
  q_proj = register_module("q_proj", linear(h, config.num_attention_heads * hd, config.attention_bias));
  k_proj = register_module("k_proj", linear(h, config.num_key_value_heads * hd, config.attention_bias));
  v_proj = register_module("v_proj", linear(h, config.num_key_value_heads * hd, config.attention_bias));
  o_proj = register_module("o_proj", linear(config.num_attention_heads * hd, h, config.attention_bias));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x) {
  const int64_t b = x.size(0), s = x.size(1), hd = config_.attention_head_dim();
  auto heads = [&](const at::Tensor& t) { return t.view({b, s, -1, hd}).transpose(1, 2); };
  at::Tensor q = heads(q_proj->forward(x)), k = heads(k_proj->forward(x)), v = heads(v_proj->forward(x));
  auto [cos, sin] = llama_rotary_tables(config_, s, x.device());
  cos = cos.to(x.scalar_type());
  sin = sin.to(x.scalar_type());
  q = apply_rotary(q, cos, sin);
  k = apply_rotary(k, cos, sin);
  // Grouped-query attention: each key/value head serves q.size(1) / k.size(1) query heads
  // (the local counts under tensor parallelism).
  const int64_t groups = q.size(1) / k.size(1);
  if (groups > 1) {
    k = k.repeat_interleave(groups, 1);
    v = v.repeat_interleave(groups, 1);
  }
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, /*is_causal=*/s > 1);
  return o_proj->forward(out.transpose(1, 2).reshape({b, s, -1}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config) {
  gate_proj = register_module("gate_proj", linear(config.hidden_size, config.intermediate_size, config.mlp_bias));
  up_proj = register_module("up_proj", linear(config.hidden_size, config.intermediate_size, config.mlp_bias));
  down_proj = register_module("down_proj", linear(config.intermediate_size, config.hidden_size, config.mlp_bias));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return down_proj->forward(at::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& config) {
  self_attn = register_module("self_attn", LlamaAttention(config));
  mlp = register_module("mlp", LlamaMLP(config));
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor LlamaDecoderLayerImpl::forward(at::Tensor x) {
  at::Tensor h = x + self_attn->forward(input_layernorm->forward(x));
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& config) {
  auto embedding = torch::nn::EmbeddingOptions(config.vocab_size, config.hidden_size);
  if (config.pad_token_id) embedding.padding_idx(*config.pad_token_id);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(embedding));
  layers = register_module("layers", torch::nn::Sequential());
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) layers->push_back(LlamaDecoderLayer(config));
  norm = register_module("norm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& input_ids) {
  return norm->forward(layers->forward(embed_tokens->forward(input_ids)));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& config) : config_(config) {
  model = register_module("model", LlamaModel(config));
  at::Tensor head_weight = config.tie_word_embeddings
                               ? model->embed_tokens->weight
                               : torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false))->weight;
  lm_head = register_module("lm_head", std::make_shared<LlamaLMHeadImpl>(head_weight));
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& input_ids) {
  return lm_head->as<LlamaLMHeadImpl>()->forward(model->forward(input_ids));
}

ParamInitFn llama_init_fn(const LlamaConfig& config) {
  const double std = config.initializer_range;
  return [std](torch::nn::Module& wrapper) {
    at::NoGradGuard no_grad;
    // A TensorParallel wrapper holds the Linear's tensors as its own.
    auto* tp = dynamic_cast<TensorParallelModule*>(&wrapper);
    torch::nn::Module& module = tp ? *tp->wrapped_module() : wrapper;
    if (auto* norm = dynamic_cast<LlamaRMSNormImpl*>(&module)) {
      norm->reset_parameters();
      return true;
    }
    if (auto* head = dynamic_cast<LlamaLMHeadImpl*>(&module)) {
      head->weight.normal_(0, std);
      return true;
    }
    if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
      lin->weight.normal_(0, std);
      if (lin->bias.defined()) lin->bias.zero_();
      return true;
    }
    if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
      emb->weight.normal_(0, std);
      if (emb->options.padding_idx()) emb->weight[*emb->options.padding_idx()].zero_();
      return true;
    }
    return false;
  };
}

FullyShardedDataParallel<LlamaForCausalLMImpl> fully_shard_llama(const LlamaForCausalLM& model, FullyShardOptions options) {
  options.auto_wrap_policy(ModuleWrapPolicy<LlamaDecoderLayerImpl>());
  return fully_shard(model, std::move(options));
}

void check_llama_tp(const LlamaConfig& config, int tp_size) {
  if (tp_size <= 0) throw Error("check_llama_tp: the TP degree is " + std::to_string(tp_size));
  for (auto [name, value] : {std::pair<const char*, int64_t>{"num_attention_heads", config.num_attention_heads},
                             {"num_key_value_heads", config.num_key_value_heads}})
    if (value % tp_size != 0)
      throw Error(std::string("Llama tensor parallelism: ") + name + " (" + std::to_string(value) +
                  ") does not divide by the TP degree " + std::to_string(tp_size) + ": each rank must hold whole heads");
}

ParallelizePlan llama_tp_plan(const LlamaConfig& config) {
  ParallelizePlan plan;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"})
      plan.emplace_back(layer + m, ColwiseParallel());
    plan.emplace_back(layer + "self_attn.o_proj", RowwiseParallel());
    plan.emplace_back(layer + "mlp.gate_proj", ColwiseParallel());
    plan.emplace_back(layer + "mlp.up_proj", ColwiseParallel());
    plan.emplace_back(layer + "mlp.down_proj", RowwiseParallel());
  }
  return plan;
}

}  // namespace fsdpp

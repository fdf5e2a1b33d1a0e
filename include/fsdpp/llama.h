#pragma once
// A Llama-family decoder (Hugging Face's LlamaForCausalLM: Llama 2 and 3, and the models that
// share its architecture), configured from a Hugging Face config.json, with Hugging Face's
// parameter names ("model.layers.3.self_attn.q_proj.weight", "lm_head.weight"), so a checkpoint
// maps without renaming (checkpoint::load_huggingface / export_huggingface).
//
//   auto config = fsdpp::LlamaConfig::from_file(dir + "/config.json");
//   auto model = fsdpp::deferred_init([&] { return fsdpp::LlamaForCausalLM(config); });  // no memory
//   auto fsdp = fsdpp::fully_shard_llama(model, options);      // each decoder layer a unit, then the root
//   fsdpp::to_empty(*fsdp);                                    // this rank's rows, uninitialized
//   fsdpp::checkpoint::load_huggingface(*fsdp, dir);           // each rank reads only its rows
//   at::Tensor logits = fsdp->forward(input_ids);              // (batch, seq) -> (batch, seq, vocab)
//
// What it computes is transformers' eager/SDPA Llama in float32: RMSNorm (in float32, then cast
// back), rotary embeddings (rope_theta; rope scaling "default" or "llama3"), grouped-query
// attention (num_key_value_heads), a SwiGLU MLP, tied or untied embeddings, an explicit head_dim.
// Positions are 0..seq-1 for every sequence (no padding mask, no KV cache).
#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/deferred_init.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/tensor_parallel.h>

namespace fsdpp {

// config.json's rope_scaling (transformers 4) or rope_parameters (transformers 5) of type llama3.
struct Llama3RopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// The fields of a Hugging Face LlamaConfig the model uses. from_json refuses what the model
// cannot express (another model_type or hidden_act, a rope scaling type other than default and
// llama3, attention dropout, partial rotary, heads that do not divide), naming the field and the
// file.
struct LlamaConfig {
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<Llama3RopeScaling> rope_scaling;  // unset: rope type "default"
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  double initializer_range = 0.02;
  std::string torch_dtype = "float32";  // config.json's "dtype" / "torch_dtype"
  std::optional<int64_t> bos_token_id, eos_token_id;  // when integers (a list of eos ids stays in source_json)
  std::optional<int64_t> pad_token_id;  // the embedding's padding_idx: its row gets no gradient
  std::string source_json;  // the config.json read, whose other fields to_json keeps

  int64_t attention_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // `what` names the source in errors (a file name).
  static LlamaConfig from_json(const std::string& json_text, const std::string& what = "config.json");
  static LlamaConfig from_file(const std::string& config_json_file);
  // A config.json transformers reads (LlamaForCausalLM, rope_theta and rope_scaling as
  // transformers 4 writes them, which transformers 5 also reads): source_json's fields with the
  // model's written over them. `dtype` overrides torch_dtype: pass the dtype exported in.
  std::string to_json(const std::string& dtype = "") const;
};

// Rotary embedding tables for positions 0..seq_len-1: cos and sin of shape (seq_len, head_dim),
// float32, computed as transformers does (inverse frequencies with the llama3 adjustment).
std::pair<at::Tensor, at::Tensor> llama_rotary_tables(const LlamaConfig& config, int64_t seq_len, at::Device device);

using LlamaLinear = TensorParallel<torch::nn::LinearImpl>;  // a plain Linear until parallelized

class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  void reset_parameters();  // ones
  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LlamaRMSNorm);

// Under tensor parallelism (llama_tp_plan) the projections hold this rank's heads: the head
// counts come from the local weights' shapes.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);
  LlamaLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))
  LlamaLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// One tensor in, one out, so the layers sit in a torch::nn::Sequential that auto-wrap policies
// and activation checkpointing reach without editing this class.
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config);
  at::Tensor forward(at::Tensor x);
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// transformers' LlamaModel: embed_tokens, layers, norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& input_ids);  // (batch, seq) -> hidden (batch, seq, hidden)
  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::Sequential layers{nullptr};
  LlamaRMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

// transformers' LlamaForCausalLM: model and lm_head; tied, lm_head.weight is
// model.embed_tokens.weight (one tensor under both names).
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& input_ids);  // (batch, seq) int64 -> logits (batch, seq, vocab)
  const LlamaConfig& config() const { return config_; }
  LlamaModel model{nullptr};
  std::shared_ptr<torch::nn::Module> lm_head;  // "lm_head.weight"

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaForCausalLM);

// transformers' initialization (Linear and Embedding weights normal(0, initializer_range),
// biases zero, RMSNorm weights one), for materialize_module's param_init_fn when training
// from scratch.
ParamInitFn llama_init_fn(const LlamaConfig& config);

// Makes every decoder layer an FSDP unit, then the whole model the root unit (embeddings,
// final norm and lm_head: tied embeddings must share a unit), as torchtitan shards Llama.
FullyShardedDataParallel<LlamaForCausalLMImpl> fully_shard_llama(const LlamaForCausalLM& model,
                                                                 FullyShardOptions options = {});

// torchtitan's tensor-parallel plan for the decoder layers: q/k/v/gate/up column-wise, o/down
// row-wise (embeddings, norms and lm_head replicated). num_attention_heads and
// num_key_value_heads must divide by the TP degree (checked by check_llama_tp).
ParallelizePlan llama_tp_plan(const LlamaConfig& config);
void check_llama_tp(const LlamaConfig& config, int tp_size);

}  // namespace fsdpp

#include "model.h"

#include <fsdpp/checkpoint.h>

namespace train_gpt {

fsdpp::LlamaConfig llama_config(const Config& c, const TextTokenizer& tokenizer) {
  fsdpp::LlamaConfig config;
  std::string where = "the shape flags";
  if (!c.init_from.empty() || !c.model_config.empty()) {
    where = c.init_from.empty() ? c.model_config : c.init_from + "/config.json";
    config = fsdpp::LlamaConfig::from_file(where);
  } else {
    config.vocab_size = tokenizer.vocab_size();
    config.hidden_size = c.dim;
    config.num_hidden_layers = c.layers;
    config.num_attention_heads = c.heads;
    config.num_key_value_heads = c.kv_heads > 0 ? c.kv_heads : c.heads;
    config.intermediate_size = c.ffn_dim > 0 ? c.ffn_dim : (8 * c.dim / 3 + 31) / 32 * 32;
    config.max_position_embeddings = c.seq;
    config.rms_norm_eps = 1e-5;
    if (const fsdpp::Tokenizer* hf = tokenizer.hf()) {
      config.bos_token_id = hf->bos_token_id();
      config.eos_token_id = hf->eos_token_id();
    }
  }
  if (tokenizer.vocab_size() > config.vocab_size)
    throw std::invalid_argument("the tokenizer " + tokenizer.source() + " has " + std::to_string(tokenizer.vocab_size()) +
                                " tokens but the model of " + where + " has vocab_size " +
                                std::to_string(config.vocab_size));
  return config;
}

Model build_model(const Config& c, const fsdpp::LlamaConfig& config, const fsdpp::ProcessGroup& world,
                  const at::Device& device, bool resuming) {
  const bool deferred = c.init == "deferred";
  torch::manual_seed(c.seed);  // the same initial weights on every rank
  auto make = [&] { return fsdpp::LlamaForCausalLM(config); };
  fsdpp::LlamaForCausalLM net = deferred || !c.init_from.empty() ? fsdpp::deferred_init(make) : make();
  if (!deferred && c.init_from.empty()) net->apply([&](torch::nn::Module& m) { fsdpp::llama_init_fn(config)(m); });
  fsdpp::FullyShardOptions options;
  if (!device.is_cpu()) options.device_id(device);
  if (c.activation_checkpointing)
    fsdpp::apply_activation_checkpointing(*net, fsdpp::ModuleWrapPolicy<fsdpp::LlamaDecoderLayerImpl>());
  if (c.replicate > 1) {
    if (world.size() % c.replicate != 0)
      throw std::invalid_argument("--replicate " + std::to_string(c.replicate) + " does not divide the world size " +
                                  std::to_string(world.size()));
    options.mesh(fsdpp::init_device_mesh(world, {c.replicate, world.size() / c.replicate}, {"replicate", "shard"}));
  }
  if (c.param_dtype == "bfloat16")
    options.mp_policy(fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
  options.auto_wrap_policy(c.activation_checkpointing
                               ? fsdpp::ModuleWrapPolicy<fsdpp::CheckpointWrapperImpl<fsdpp::LlamaDecoderLayerImpl>>()
                               : fsdpp::ModuleWrapPolicy<fsdpp::LlamaDecoderLayerImpl>());
  Model model = fsdpp::fully_shard(net, options);
  if (resuming) {
    if (deferred || !c.init_from.empty()) fsdpp::to_empty(*model);
  } else if (!c.init_from.empty()) {
    fsdpp::to_empty(*model);
    // Each rank reads its rows, into the shards in place (no second copy of the model).
    fsdpp::checkpoint::load_huggingface(*model, c.init_from, fsdpp::checkpoint::HuggingFaceLoadOptions().in_place(true));
  } else if (deferred) {
    fsdpp::materialize_module(*model, fsdpp::MaterializeOptions()
                                          .seed(static_cast<uint64_t>(c.seed))
                                          .param_init_fn(fsdpp::llama_init_fn(config)));
  }
  return model;
}

double training_flops_per_token(const fsdpp::LlamaConfig& config, int64_t seq) {
  const double d = static_cast<double>(config.hidden_size), kv = static_cast<double>(config.num_key_value_heads),
               hd = static_cast<double>(config.attention_head_dim()), h = static_cast<double>(config.num_attention_heads),
               ffn = static_cast<double>(config.intermediate_size);
  const double per_layer = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * ffn;  // q, o; k, v; gate, up, down
  const double matmul_params = static_cast<double>(config.num_hidden_layers) * per_layer +
                               d * static_cast<double>(config.vocab_size);  // the LM head
  return 6 * matmul_params + 12 * static_cast<double>(config.num_hidden_layers) * h * hd * static_cast<double>(seq);
}

}  // namespace train_gpt

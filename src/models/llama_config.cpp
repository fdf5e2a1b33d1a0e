// LlamaConfig from and to a Hugging Face config.json (transformers 4's rope_theta / rope_scaling
// and transformers 5's rope_parameters alike).
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <fsdpp/error.h>
#include <fsdpp/llama.h>

namespace fsdpp {

using nlohmann::json;

namespace {

template <typename T>
void read_field(const json& j, const char* key, T& out, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    throw Error(what + ": '" + key + "' is " + it->dump() + ", not a " +
                (std::is_same_v<T, bool> ? "boolean" : std::is_same_v<T, std::string> ? "string" : "number"));
  }
}

void require_positive(int64_t value, const char* key, const std::string& what) {
  if (value <= 0) throw Error(what + ": '" + key + "' is " + std::to_string(value) + "; it must be positive");
}

// rope_scaling (transformers 4) or rope_parameters (5): type "default" or "llama3".
void read_rope(const json& j, LlamaConfig& c, const std::string& what) {
  const json* rope = nullptr;
  const char* field = "rope_scaling";
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    rope = &j["rope_parameters"];
    field = "rope_parameters";
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    rope = &j["rope_scaling"];
  }
  if (!rope) return;
  read_field(*rope, "rope_theta", c.rope_theta, what + ": " + field);
  std::string type = "default";
  read_field(*rope, "type", type, what + ": " + field);
  read_field(*rope, "rope_type", type, what + ": " + field);
  if (type == "default") return;
  if (type != "llama3")
    throw Error(what + ": " + field + " has rope type '" + type +
                "', which fsdpp's Llama cannot express (it knows \"default\" and \"llama3\")");
  Llama3RopeScaling s;
  for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
    if (!rope->contains(key)) throw Error(what + ": " + field + " of type llama3 has no '" + key + "'");
  read_field(*rope, "factor", s.factor, what);
  read_field(*rope, "low_freq_factor", s.low_freq_factor, what);
  read_field(*rope, "high_freq_factor", s.high_freq_factor, what);
  read_field(*rope, "original_max_position_embeddings", s.original_max_position_embeddings, what);
  if (s.high_freq_factor == s.low_freq_factor)
    throw Error(what + ": " + field + " has high_freq_factor equal to low_freq_factor (" +
                std::to_string(s.low_freq_factor) + "): the llama3 interpolation divides by their difference");
  c.rope_scaling = s;
}

}  // namespace

LlamaConfig LlamaConfig::from_json(const std::string& json_text, const std::string& what) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    throw Error(what + " is not JSON: " + e.what());
  }
  if (!j.is_object()) throw Error(what + " is not a JSON object");
  std::string model_type = "llama";
  read_field(j, "model_type", model_type, what);
  if (model_type != "llama")
    throw Error(what + ": model_type is '" + model_type + "'; fsdpp's Llama reads \"llama\" configs only");
  std::string act = "silu";
  read_field(j, "hidden_act", act, what);
  if (act != "silu" && act != "swish")
    throw Error(what + ": hidden_act is '" + act + "'; fsdpp's Llama computes SwiGLU with silu (swish) only");
  // pretraining_tp splits the same matmuls into slices in transformers 4: the same function.
  double dropout = 0, partial_rotary = 1;
  read_field(j, "attention_dropout", dropout, what);
  if (dropout != 0)
    throw Error(what + ": attention_dropout is " + j["attention_dropout"].dump() + "; fsdpp's Llama has no attention dropout");
  read_field(j, "partial_rotary_factor", partial_rotary, what);
  if (partial_rotary != 1)
    throw Error(what + ": partial_rotary_factor is " + j["partial_rotary_factor"].dump() +
                "; fsdpp's Llama rotates the whole head dimension only");
  LlamaConfig c;
  c.source_json = json_text;
  read_field(j, "vocab_size", c.vocab_size, what);
  read_field(j, "hidden_size", c.hidden_size, what);
  read_field(j, "intermediate_size", c.intermediate_size, what);
  read_field(j, "num_hidden_layers", c.num_hidden_layers, what);
  read_field(j, "num_attention_heads", c.num_attention_heads, what);
  c.num_key_value_heads = c.num_attention_heads;  // transformers' default
  read_field(j, "num_key_value_heads", c.num_key_value_heads, what);
  read_field(j, "head_dim", c.head_dim, what);
  read_field(j, "max_position_embeddings", c.max_position_embeddings, what);
  read_field(j, "rms_norm_eps", c.rms_norm_eps, what);
  read_field(j, "rope_theta", c.rope_theta, what);
  read_field(j, "tie_word_embeddings", c.tie_word_embeddings, what);
  read_field(j, "attention_bias", c.attention_bias, what);
  read_field(j, "mlp_bias", c.mlp_bias, what);
  read_field(j, "initializer_range", c.initializer_range, what);
  read_field(j, "torch_dtype", c.torch_dtype, what);
  read_field(j, "dtype", c.torch_dtype, what);
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<int64_t>();
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"].get<int64_t>();
  if (j.contains("pad_token_id") && j["pad_token_id"].is_number_integer()) c.pad_token_id = j["pad_token_id"].get<int64_t>();
  read_rope(j, c, what);
  require_positive(c.vocab_size, "vocab_size", what);
  require_positive(c.hidden_size, "hidden_size", what);
  require_positive(c.intermediate_size, "intermediate_size", what);
  require_positive(c.num_hidden_layers, "num_hidden_layers", what);
  require_positive(c.num_attention_heads, "num_attention_heads", what);
  require_positive(c.num_key_value_heads, "num_key_value_heads", what);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw Error(what + ": num_attention_heads (" + std::to_string(c.num_attention_heads) +
                ") is not a multiple of num_key_value_heads (" + std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim <= 0 && c.hidden_size % c.num_attention_heads != 0)
    throw Error(what + ": hidden_size (" + std::to_string(c.hidden_size) + ") is not a multiple of num_attention_heads (" +
                std::to_string(c.num_attention_heads) + ") and no head_dim is given");
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size))
    throw Error(what + ": pad_token_id " + std::to_string(*c.pad_token_id) + " is outside the vocabulary of " +
                std::to_string(c.vocab_size));
  if (c.attention_head_dim() % 2 != 0)
    throw Error(what + ": the head dimension " + std::to_string(c.attention_head_dim()) + " is odd; rotary embeddings need an even one");
  return c;
}

LlamaConfig LlamaConfig::from_file(const std::string& config_json_file) {
  std::ifstream in(config_json_file);
  if (!in) throw Error("cannot open the model config " + config_json_file);
  std::stringstream text;
  text << in.rdbuf();
  return from_json(text.str(), config_json_file);
}

std::string LlamaConfig::to_json(const std::string& dtype) const {
  // The source's other fields (a list of eos ids, generation settings, ...) are kept; the
  // model's own are written over them.
  json j = source_json.empty() ? json::object() : json::parse(source_json);
  j.erase("rope_parameters");  // rope_theta and rope_scaling below say it, as transformers 4 does
  j.erase("dtype");
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_act"] = "silu";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = attention_head_dim();
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", rope_scaling->factor},
                         {"low_freq_factor", rope_scaling->low_freq_factor},
                         {"high_freq_factor", rope_scaling->high_freq_factor},
                         {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  else
    j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = mlp_bias;
  j["pretraining_tp"] = 1;
  j["initializer_range"] = initializer_range;
  j["torch_dtype"] = dtype.empty() ? torch_dtype : dtype;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_id) j["eos_token_id"] = *eos_token_id;
  if (pad_token_id) j["pad_token_id"] = *pad_token_id;
  return j.dump(2) + "\n";
}

}  // namespace fsdpp

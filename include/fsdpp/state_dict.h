#pragma once
// Model state dicts of FSDP models (PyTorch's FSDP.state_dict_type / model.state_dict() and
// torch.distributed.checkpoint.state_dict's get_model_state_dict / set_model_state_dict).
//
// Keys are always the plain model's keys (no `_fsdp_wrapped_module.` segment), in module
// order: each module's parameters, then its buffers, then its children's. Three kinds:
//   FULL_STATE_DICT     every entry a whole tensor (all-gathered); a plain model loads it.
//   SHARDED_STATE_DICT  each FSDP-sharded parameter a ShardedTensor (this rank's dim-0 rows
//                       with their offsets); other parameters and buffers whole tensors.
//   LOCAL_STATE_DICT    per FSDP unit one `<unit>._flat_param` ShardedTensor: the unit's
//                       parameters flattened and concatenated (FSDP1's flat parameter) of
//                       which this rank holds the rows it shards, without padding.
// See docs/api.md, "State dicts".
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fsdpp/sharded_tensor.h>

namespace fsdpp {

enum class StateDictType { FULL_STATE_DICT, LOCAL_STATE_DICT, SHARDED_STATE_DICT };
const char* to_string(StateDictType type);

// One entry of a state dict: a whole tensor or a ShardedTensor.
class StateDictValue {
 public:
  StateDictValue() = default;
  StateDictValue(at::Tensor t) : value_(std::move(t)) {}        // NOLINT: implicit on purpose
  StateDictValue(ShardedTensor t) : value_(std::move(t)) {}     // NOLINT: implicit on purpose

  bool is_tensor() const { return std::holds_alternative<at::Tensor>(value_); }
  bool is_sharded() const { return std::holds_alternative<ShardedTensor>(value_); }
  // Throw fsdpp::Error when the entry is of the other kind.
  const at::Tensor& tensor() const;
  const ShardedTensor& sharded_tensor() const;
  // The global shape and dtype, whichever the kind.
  std::vector<int64_t> sizes() const;
  at::ScalarType dtype() const;

 private:
  std::variant<at::Tensor, ShardedTensor> value_;
};

// An ordered dict from key to StateDictValue (insertion order is kept).
class StateDict {
 public:
  using Item = std::pair<std::string, StateDictValue>;

  // Throws if the key is already present.
  void insert(std::string key, StateDictValue value);
  // Inserts or replaces.
  void set(const std::string& key, StateDictValue value);
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  const StateDictValue* find(const std::string& key) const;
  // Throws fsdpp::Error naming the key when absent.
  const StateDictValue& at(const std::string& key) const;
  bool erase(const std::string& key);
  std::vector<std::string> keys() const;
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }

  // The kind of dict fsdpp produced (unset for a dict built by hand or read from a file of
  // unknown kind). Loads check it against the expected kind.
  std::optional<StateDictType> type;
  // Set on the empty dict a FULL state dict with rank0_only gives the ranks other than 0:
  // loading it there is an error (use broadcast_from_rank0, or load rank 0's dict).
  bool rank0_only_placeholder = false;

 private:
  std::vector<Item> items_;
};

// torch::save(sd, path) / torch::load(sd, path). A dict of whole tensors (FULL) loads anywhere; a
// SHARDED or LOCAL dict is this rank's part, as PyTorch's pickled ShardedTensor: one file per rank,
// read back by the same rank at the same world size (over the default group; a ShardedTensor over
// a subgroup is refused). The distributed checkpoint reshards.
void operator<<(torch::serialize::OutputArchive& archive, const StateDict& sd);
void operator>>(torch::serialize::InputArchive& archive, StateDict& sd);

// ---- FSDP1 style: a state-dict type per model ----------------------------------------------

struct FullStateDictConfig {
  FullStateDictConfig& offload_to_cpu(bool v) { offload_to_cpu_ = v; return *this; }
  // Only rank 0 gets the entries; the others get an empty dict (rank0_only_placeholder).
  FullStateDictConfig& rank0_only(bool v) { rank0_only_ = v; return *this; }
  bool offload_to_cpu_ = false;
  bool rank0_only_ = false;
};
struct ShardedStateDictConfig {
  ShardedStateDictConfig& offload_to_cpu(bool v) { offload_to_cpu_ = v; return *this; }
  bool offload_to_cpu_ = false;
};
struct LocalStateDictConfig {
  LocalStateDictConfig& offload_to_cpu(bool v) { offload_to_cpu_ = v; return *this; }
  bool offload_to_cpu_ = false;
};
using StateDictConfig = std::variant<FullStateDictConfig, ShardedStateDictConfig, LocalStateDictConfig>;
const char* config_type_name(const StateDictConfig& config);

struct StateDictSettings {
  StateDictType state_dict_type = StateDictType::FULL_STATE_DICT;
  StateDictConfig state_dict_config = FullStateDictConfig();
};

// Sets the type (and config; default: the type's default config) that state_dict(model) and
// load_state_dict(model, ...) use, on `model` and every FSDP unit inside it. A config of
// another type than `type` throws "expected state_dict_config of type ...". Returns the
// previous settings of `model`.
StateDictSettings set_state_dict_type(torch::nn::Module& model, StateDictType type,
                                      std::optional<StateDictConfig> config = std::nullopt);
// The model's settings: its own, else those of the first FSDP unit inside it, else FULL.
StateDictSettings get_state_dict_type(const torch::nn::Module& model);

// The scope form: sets the type now, restores the previous settings when it goes out of scope.
//   { auto scope = fsdpp::state_dict_type(*model, fsdpp::StateDictType::SHARDED_STATE_DICT);
//     auto sd = fsdpp::state_dict(*model); }
class [[nodiscard]] StateDictTypeScope {
 public:
  StateDictTypeScope(torch::nn::Module& model, StateDictType type, std::optional<StateDictConfig> config);
  ~StateDictTypeScope();
  StateDictTypeScope(const StateDictTypeScope&) = delete;
  StateDictTypeScope& operator=(const StateDictTypeScope&) = delete;

 private:
  std::weak_ptr<torch::nn::Module> model_;
  std::vector<std::pair<std::weak_ptr<torch::nn::Module>, std::optional<StateDictSettings>>> previous_;
};
StateDictTypeScope state_dict_type(torch::nn::Module& model, StateDictType type,
                                   std::optional<StateDictConfig> config = std::nullopt);

// PyTorch's _IncompatibleKeys: what a non-strict load skipped (plain keys).
struct IncompatibleKeys {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

// The model's state dict of its current state-dict type. Collective over each unit's group for
// FULL (an all-gather per unit); SHARDED and LOCAL communicate nothing. Entries are copies.
StateDict state_dict(torch::nn::Module& model);
// Loads a state dict of the model's current type. Everything is checked before anything is
// written (a failed load leaves the model unchanged): keys (strict: missing and unexpected ones
// are an error listing them; otherwise they are returned), shapes (always an error naming the
// key and both shapes), the kind of each entry. A ShardedTensor sharded differently from the
// model (another world size) is redistributed: collective over its process group.
IncompatibleKeys load_state_dict(torch::nn::Module& model, const StateDict& sd, bool strict = true);

// ---- Functional style (torch.distributed.checkpoint.state_dict) ---------------------------

struct StateDictOptions {
  // FULL instead of SHARDED.
  StateDictOptions& full_state_dict(bool v) { full_state_dict_ = v; return *this; }
  // Offload to CPU; with full_state_dict, only rank 0 gets the entries (others: empty dict).
  StateDictOptions& cpu_offload(bool v) { cpu_offload_ = v; return *this; }
  // Loading: missing or unexpected keys are an error.
  StateDictOptions& strict(bool v) { strict_ = v; return *this; }
  // Loading a FULL dict that only rank 0 holds: rank 0 broadcasts it over the default group
  // (every rank of it must call set_model_state_dict / set_optimizer_state_dict).
  StateDictOptions& broadcast_from_rank0(bool v) { broadcast_from_rank0_ = v; return *this; }

  bool full_state_dict_ = false;
  bool cpu_offload_ = false;
  bool strict_ = true;
  bool broadcast_from_rank0_ = false;
};

StateDict get_model_state_dict(torch::nn::Module& model, const StateDictOptions& options = {});
// Accepts a FULL or SHARDED dict (each entry by its kind).
IncompatibleKeys set_model_state_dict(torch::nn::Module& model, const StateDict& sd,
                                      const StateDictOptions& options = {});

// Overloads for module holders (fsdpp::FullyShardedDataParallel<...>, torch::nn::Sequential).
template <typename M>
StateDict state_dict(const torch::nn::ModuleHolder<M>& model) {
  return state_dict(*model.ptr());
}
template <typename M>
IncompatibleKeys load_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDict& sd, bool strict = true) {
  return load_state_dict(*model.ptr(), sd, strict);
}
template <typename M>
StateDict get_model_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDictOptions& options = {}) {
  return get_model_state_dict(*model.ptr(), options);
}
template <typename M>
IncompatibleKeys set_model_state_dict(const torch::nn::ModuleHolder<M>& model, const StateDict& sd,
                                      const StateDictOptions& options = {}) {
  return set_model_state_dict(*model.ptr(), sd, options);
}

}  // namespace fsdpp

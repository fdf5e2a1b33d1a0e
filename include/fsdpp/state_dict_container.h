#pragma once
// fsdpp::StateDict, the container every state dict is (PyTorch's Dict[str, Tensor | ShardedTensor]):
// an ordered dict from key to a whole tensor or a ShardedTensor, with the kind of dict fsdpp
// produced. A low header of its own so that the optimizer state (<fsdpp/optimizer_state_dict.h>)
// holds StateDicts without the state-dict API of <fsdpp/state_dict.h>, which is built on it.
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>
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

}  // namespace fsdpp

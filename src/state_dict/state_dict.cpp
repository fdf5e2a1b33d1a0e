// StateDictValue and StateDict: the containers, and their torch::save / torch::load form.
#include <fsdpp/state_dict.h>

#include <sstream>

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>

#include <fsdpp/error.h>

namespace fsdpp {

const char* to_string(StateDictType type) {
  switch (type) {
    case StateDictType::FULL_STATE_DICT: return "FULL_STATE_DICT";
    case StateDictType::LOCAL_STATE_DICT: return "LOCAL_STATE_DICT";
    case StateDictType::SHARDED_STATE_DICT: return "SHARDED_STATE_DICT";
  }
  return "?";
}

const at::Tensor& StateDictValue::tensor() const {
  if (!is_tensor()) throw Error("state dict entry is a ShardedTensor, not a tensor");
  return std::get<at::Tensor>(value_);
}

const ShardedTensor& StateDictValue::sharded_tensor() const {
  if (!is_sharded()) throw Error("state dict entry is a tensor, not a ShardedTensor");
  return std::get<ShardedTensor>(value_);
}

std::vector<int64_t> StateDictValue::sizes() const {
  return is_tensor() ? tensor().sizes().vec() : sharded_tensor().size();
}

at::ScalarType StateDictValue::dtype() const { return is_tensor() ? tensor().scalar_type() : sharded_tensor().dtype(); }

void StateDict::insert(std::string key, StateDictValue value) {
  if (contains(key)) throw Error("StateDict::insert: key '" + key + "' is already present");
  items_.emplace_back(std::move(key), std::move(value));
}

void StateDict::set(const std::string& key, StateDictValue value) {
  for (auto& item : items_)
    if (item.first == key) {
      item.second = std::move(value);
      return;
    }
  items_.emplace_back(key, std::move(value));
}

const StateDictValue* StateDict::find(const std::string& key) const {
  for (const auto& item : items_)
    if (item.first == key) return &item.second;
  return nullptr;
}

const StateDictValue& StateDict::at(const std::string& key) const {
  if (const auto* v = find(key)) return *v;
  throw Error("state dict has no key '" + key + "'");
}

bool StateDict::erase(const std::string& key) {
  for (auto it = items_.begin(); it != items_.end(); ++it)
    if (it->first == key) {
      items_.erase(it);
      return true;
    }
  return false;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

namespace {
// Archive entry names cannot hold '.', so keys are stored as a list and tensors by index.
constexpr const char* kKeys = "fsdpp_state_dict_keys";
constexpr const char* kType = "fsdpp_state_dict_type";
}  // namespace

void operator<<(torch::serialize::OutputArchive& archive, const StateDict& sd) {
  c10::List<std::string> keys;
  for (const auto& [key, value] : sd) {
    if (value.is_sharded())
      throw Error("saving a state dict with torch::save: '" + key +
                  "' is a ShardedTensor; torch::save takes whole tensors (a FULL state dict). Save SHARDED and "
                  "LOCAL state dicts with the distributed checkpoint, or full_tensor() them first");
    keys.push_back(key);
  }
  archive.write(kKeys, c10::IValue(keys));
  archive.write(kType, c10::IValue(sd.type ? static_cast<int64_t>(*sd.type) : int64_t{-1}));
  int64_t i = 0;
  for (const auto& [key, value] : sd) archive.write("t" + std::to_string(i++), value.tensor().detach());
}

void operator>>(torch::serialize::InputArchive& archive, StateDict& sd) {
  c10::IValue keys;
  if (!archive.try_read(kKeys, keys) || !keys.isList())
    throw Error("loading a state dict with torch::load: the archive has no '" + std::string(kKeys) +
                "' entry (not written from an fsdpp::StateDict)");
  StateDict out;
  c10::IValue type;
  if (archive.try_read(kType, type) && type.isInt() && type.toInt() >= 0)
    out.type = static_cast<StateDictType>(type.toInt());
  int64_t i = 0;
  for (const auto& k : keys.toListRef()) {
    at::Tensor t;
    if (!archive.try_read("t" + std::to_string(i++), t))
      throw Error("loading a state dict with torch::load: the tensor of '" + k.toStringRef() + "' is missing");
    out.insert(k.toStringRef(), std::move(t));
  }
  sd = std::move(out);
}

const char* config_type_name(const StateDictConfig& config) {
  switch (config.index()) {
    case 0: return "FullStateDictConfig";
    case 1: return "ShardedStateDictConfig";
    default: return "LocalStateDictConfig";
  }
}

}  // namespace fsdpp

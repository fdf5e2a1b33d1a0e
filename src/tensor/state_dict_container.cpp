// StateDictValue and StateDict: the containers, and their torch::save / torch::load form.
#include <fsdpp/state_dict_container.h>

#include <sstream>

#include <ATen/core/List.h>
#include <ATen/core/ivalue.h>

#include <fsdpp/error.h>
#include <fsdpp/process_group.h>
#include <fsdpp/sharded_tensor.h>

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
// Archive entry names cannot hold '.', so keys are stored as a list and tensors by index: "t<i>"
// a whole tensor, or a ShardedTensor as "t<i>" its local shards' tensors and "m<i>" its layout.
constexpr const char* kKeys = "fsdpp_state_dict_keys";
constexpr const char* kType = "fsdpp_state_dict_type";

// The group a ShardedTensor is sharded over (none recorded: the default group).
ProcessGroup group_of(const ShardedTensor& st) {
  return st.process_group().defined() ? st.process_group() : default_group();
}

// A ShardedTensor is this rank's part of a whole: as PyTorch's pickled ShardedTensor, it loads
// back in a process of the same rank in a default group of the same size, where it is again
// sharded over the default group. So only ShardedTensors over the whole world are written.
void check_savable(const std::string& key, const ShardedTensor& st) {
  const ProcessGroup group = group_of(st);
  const ProcessGroup world = default_group();
  if (group.ranks() != world.ranks())
    throw Error("saving a state dict with torch::save: '" + key + "' is a ShardedTensor over process group " +
                group.name() + " (" + std::to_string(group.size()) + " of " + std::to_string(world.size()) +
                " ranks), and torch::load rebuilds ShardedTensors over the default group only; save it with the "
                "distributed checkpoint (checkpoint::save), or full_tensor() it first");
}

// The layout as one int list: dtype, group rank, group size, dims, global size, then per shard
// its placement, offsets and sizes.
c10::List<int64_t> layout_of(const ShardedTensor& st) {
  const ProcessGroup group = group_of(st);
  c10::List<int64_t> out;
  for (int64_t v : {static_cast<int64_t>(st.dtype()), int64_t{group.rank()}, int64_t{group.size()}, st.dim()})
    out.push_back(v);
  for (int64_t v : st.size()) out.push_back(v);
  for (const auto& m : st.shards_metadata()) {
    out.push_back(m.placement);
    for (int64_t v : m.shard_offsets) out.push_back(v);
    for (int64_t v : m.shard_sizes) out.push_back(v);
  }
  return out;
}

ShardedTensor sharded_from(const std::string& key, const c10::List<int64_t>& layout, const c10::List<at::Tensor>& tensors) {
  const auto bad = [&](const std::string& why) {
    return Error("loading a state dict with torch::load: the ShardedTensor '" + key + "' " + why);
  };
  const std::vector<int64_t> v(layout.begin(), layout.end());
  if (v.size() < 4 || v[3] < 0 || v.size() < 4 + static_cast<size_t>(v[3])) throw bad("has a truncated layout");
  const auto dtype = static_cast<at::ScalarType>(v[0]);
  const int saved_rank = static_cast<int>(v[1]), saved_size = static_cast<int>(v[2]);
  const size_t dims = static_cast<size_t>(v[3]);
  if (!is_initialized())
    throw bad("was saved by rank " + std::to_string(saved_rank) + " of " + std::to_string(saved_size) +
              "; loading it needs the default process group (init_process_group)");
  const ProcessGroup world = default_group();
  if (world.rank() != saved_rank || world.size() != saved_size)
    throw bad("was saved by rank " + std::to_string(saved_rank) + " of " + std::to_string(saved_size) +
              ", and this process is rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) +
              ": a rank loads its own file at the same world size (the distributed checkpoint reshards)");
  std::vector<int64_t> global(v.begin() + 4, v.begin() + 4 + static_cast<std::ptrdiff_t>(dims));
  std::vector<ShardMetadata> all;
  std::vector<Shard> local;
  for (size_t i = 4 + dims; i < v.size();) {
    if (i + 1 + 2 * dims > v.size()) throw bad("has a truncated shard layout");
    ShardMetadata m;
    m.placement = static_cast<int>(v[i]);
    m.shard_offsets.assign(v.begin() + static_cast<std::ptrdiff_t>(i + 1), v.begin() + static_cast<std::ptrdiff_t>(i + 1 + dims));
    m.shard_sizes.assign(v.begin() + static_cast<std::ptrdiff_t>(i + 1 + dims),
                         v.begin() + static_cast<std::ptrdiff_t>(i + 1 + 2 * dims));
    i += 1 + 2 * dims;
    if (m.placement == saved_rank) {
      if (local.size() >= tensors.size()) throw bad("lists more local shards than it holds tensors");
      local.push_back({tensors.get(local.size()), m});
    }
    all.push_back(std::move(m));
  }
  if (local.size() != tensors.size()) throw bad("holds more tensors than local shards");
  return ShardedTensor::from_local_shards_and_global_metadata(std::move(local), std::move(global), dtype,
                                                              std::move(all), world);
}
}  // namespace

void operator<<(torch::serialize::OutputArchive& archive, const StateDict& sd) {
  c10::List<std::string> keys;
  for (const auto& [key, value] : sd) {
    if (value.is_sharded()) check_savable(key, value.sharded_tensor());
    keys.push_back(key);
  }
  archive.write(kKeys, c10::IValue(keys));
  archive.write(kType, c10::IValue(sd.type ? static_cast<int64_t>(*sd.type) : int64_t{-1}));
  int64_t i = 0;
  for (const auto& [key, value] : sd) {
    const std::string index = std::to_string(i++);
    if (!value.is_sharded()) {
      archive.write("t" + index, value.tensor().detach());
      continue;
    }
    const ShardedTensor& st = value.sharded_tensor();
    c10::List<at::Tensor> shards;
    for (const auto& shard : st.local_shards()) shards.push_back(shard.tensor.detach());
    archive.write("t" + index, c10::IValue(shards));
    archive.write("m" + index, c10::IValue(layout_of(st)));
  }
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
    const std::string& key = k.toStringRef();
    const std::string index = std::to_string(i++);
    c10::IValue layout;
    if (archive.try_read("m" + index, layout)) {
      c10::IValue shards;
      if (!layout.isIntList() || !archive.try_read("t" + index, shards) || !shards.isTensorList())
        throw Error("loading a state dict with torch::load: the shards of ShardedTensor '" + key + "' are missing");
      out.insert(key, sharded_from(key, layout.toIntList(), shards.toTensorList()));
      continue;
    }
    at::Tensor t;
    if (!archive.try_read("t" + index, t))
      throw Error("loading a state dict with torch::load: the tensor of '" + key + "' is missing");
    out.insert(key, std::move(t));
  }
  sd = std::move(out);
}

}  // namespace fsdpp

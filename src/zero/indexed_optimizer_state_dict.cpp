// IndexedOptimizerStateDict: an optimizer's state in libtorch's archive layout, with positional keys.
#include <sstream>
#include <unordered_map>

#include <c10/util/Exception.h>

#include <fsdpp/indexed_optimizer_state_dict.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#include "optim/optimizer_state.h"

namespace fsdpp {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

IndexedOptimizerStateDict::IndexedOptimizerStateDict(const IndexedOptimizerStateDict& other) { *this = other; }

IndexedOptimizerStateDict& IndexedOptimizerStateDict::operator=(const IndexedOptimizerStateDict& other) {
  if (this == &other) return *this;
  std::vector<ParamGroup> groups;
  for (const auto& g : other.param_groups) groups.push_back({g.params, g.options ? g.options->clone() : nullptr});
  std::map<int64_t, std::unique_ptr<torch::optim::OptimizerParamState>> st;
  for (const auto& [k, v] : other.state) st.emplace(k, v ? v->clone() : nullptr);
  param_groups = std::move(groups);
  state = std::move(st);
  return *this;
}

int64_t IndexedOptimizerStateDict::num_params() const {
  int64_t n = 0;
  for (const auto& g : param_groups) n += static_cast<int64_t>(g.params.size());
  return n;
}

IndexedOptimizerStateDict IndexedOptimizerStateDict::from_optimizer(const torch::optim::Optimizer& optimizer) {
  IndexedOptimizerStateDict sd;
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    ParamGroup g;
    g.options = group.options().clone();
    for (const auto& p : group.params()) {
      if (const auto* st = detail::find_param_state(optimizer, p)) sd.state.emplace(index, st->clone());
      g.params.push_back(index++);
    }
    sd.param_groups.push_back(std::move(g));
  }
  return sd;
}

void IndexedOptimizerStateDict::save(OutputArchive& archive) const {
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  OutputArchive state_archive(archive.compilation_unit());
  for (const auto& [index, st] : state) {
    if (!st) throw Error("IndexedOptimizerStateDict::save: the state of parameter " + std::to_string(index) + " is null");
    OutputArchive entry(archive.compilation_unit());
    st->serialize(entry);
    state_archive.write(std::to_string(index), entry);
  }
  archive.write("state", state_archive);

  OutputArchive groups_archive(archive.compilation_unit());
  groups_archive.write("param_groups/size", at::scalar_tensor(static_cast<int64_t>(param_groups.size()), at::kLong));
  for (size_t i = 0; i < param_groups.size(); ++i) {
    const auto& g = param_groups[i];
    if (!g.options) throw Error("IndexedOptimizerStateDict::save: parameter group " + std::to_string(i) + " has no options");
    OutputArchive group_archive(archive.compilation_unit());
    group_archive.write("params/size", at::scalar_tensor(static_cast<int64_t>(g.params.size()), at::kLong));
    for (size_t j = 0; j < g.params.size(); ++j)
      group_archive.write("params/" + std::to_string(j), c10::IValue(std::to_string(g.params[j])));
    OutputArchive options_archive(archive.compilation_unit());
    g.options->serialize(options_archive);
    group_archive.write("options", options_archive);
    groups_archive.write("param_groups/" + std::to_string(i), group_archive);
  }
  archive.write("param_groups", groups_archive);
}

std::string IndexedOptimizerStateDict::to_bytes() const {
  OutputArchive archive;
  save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

IndexedOptimizerStateDict IndexedOptimizerStateDict::load(InputArchive& archive, const torch::optim::OptimizerOptions& options_prototype,
                                            const StateFactory& make_state) {
  IndexedOptimizerStateDict sd;
  std::string where = "the archive";
  try {
    c10::IValue version;
    if (!archive.try_read("pytorch_version", version) || !version.isString())
      throw Error("reading an optimizer state dict: the archive has no 'pytorch_version' entry (not an optimizer archive)");
    if (version.toStringRef() != "1.5.0")
      throw Error("reading an optimizer state dict: unsupported layout version '" + version.toStringRef() + "' (expected 1.5.0)");

    where = "'param_groups'";
    InputArchive groups_archive;
    archive.read("param_groups", groups_archive);
    at::Tensor size;
    groups_archive.read("param_groups/size", size);
    std::unordered_map<std::string, int64_t> index_of_key;
    int64_t index = 0;
    for (int64_t i = 0; i < size.item<int64_t>(); ++i) {
      where = "parameter group " + std::to_string(i);
      InputArchive group_archive;
      groups_archive.read("param_groups/" + std::to_string(i), group_archive);
      at::Tensor num_params;
      group_archive.read("params/size", num_params);
      ParamGroup g;
      for (int64_t j = 0; j < num_params.item<int64_t>(); ++j) {
        c10::IValue key;
        group_archive.read("params/" + std::to_string(j), key);
        if (!index_of_key.emplace(key.toStringRef(), index).second)
          throw Error("reading an optimizer state dict: parameter key '" + key.toStringRef() +
                      "' appears twice in param_groups");
        g.params.push_back(index++);
      }
      InputArchive options_archive;
      group_archive.read("options", options_archive);
      g.options = options_prototype.clone();
      g.options->serialize(options_archive);
      sd.param_groups.push_back(std::move(g));
    }

    where = "'state'";
    InputArchive state_archive;
    archive.read("state", state_archive);
    for (const std::string& key : state_archive.keys()) {
      where = "the state entry '" + key + "'";
      auto it = index_of_key.find(key);
      if (it == index_of_key.end())
        throw Error("reading an optimizer state dict: state entry '" + key + "' belongs to no parameter of param_groups");
      InputArchive entry;
      state_archive.read(key, entry);
      auto st = make_state();
      st->serialize(entry);
      sd.state[it->second] = std::move(st);
    }
  } catch (const c10::Error& e) {
    throw Error("reading an optimizer state dict: cannot read " + where + " as " +
                detail::demangled(typeid(options_prototype)) + "'s optimizer: " + e.what_without_backtrace());
  }
  return sd;
}

IndexedOptimizerStateDict IndexedOptimizerStateDict::from_bytes(const std::string& bytes,
                                                  const torch::optim::OptimizerOptions& options_prototype,
                                                  const StateFactory& make_state) {
  InputArchive archive;
  try {
    std::istringstream in(bytes);
    archive.load_from(in);
  } catch (const c10::Error& e) {
    throw Error("reading an optimizer state dict: " + std::to_string(bytes.size()) +
                " bytes are not a libtorch archive: " + e.what_without_backtrace());
  }
  return load(archive, options_prototype, make_state);
}

}  // namespace fsdpp

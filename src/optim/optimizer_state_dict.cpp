// OptimizerStateDict: an optimizer's state, as libtorch's optimizer archive and as fsdpp's own
// torch::save layout.
#include <fsdpp/optimizer_state_dict.h>

#include <cstring>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

#include <ATen/ATen.h>
#include <ATen/core/List.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <fsdpp/error.h>

#include "optim/optimizer_state.h"

namespace fsdpp {

using torch::serialize::InputArchive;
using torch::serialize::OutputArchive;

std::string OptimizerStateDict::ParamGroup::serialized_options() const {
  return options ? detail::options_to_bytes(*options) : options_bytes;
}

int64_t OptimizerStateDict::num_params() const {
  int64_t n = 0;
  for (const auto& g : param_groups) n += static_cast<int64_t>(g.params.size());
  return n;
}

OptimizerStateDict OptimizerStateDict::from_optimizer(const torch::optim::Optimizer& optimizer) {
  OptimizerStateDict sd;
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    ParamGroup g;
    g.options = group.options().clone();
    for (const auto& p : group.params()) {
      const std::string key = std::to_string(index++);
      if (const auto* st = detail::find_param_state(optimizer, p)) sd.state.emplace(key, detail::param_state_entries(*st));
      g.params.push_back(key);
    }
    sd.param_groups.push_back(std::move(g));
  }
  return sd;
}

void OptimizerStateDict::save(OutputArchive& archive) const {
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  OutputArchive state_archive(archive.compilation_unit());
  for (const auto& [key, entries] : state) {
    OutputArchive entry(archive.compilation_unit());
    try {
      detail::write_param_state(entries, entry);
    } catch (const Error& e) {
      throw Error("OptimizerStateDict::save: parameter '" + key + "': " + e.what());
    }
    state_archive.write(key, entry);
  }
  archive.write("state", state_archive);

  OutputArchive groups_archive(archive.compilation_unit());
  groups_archive.write("param_groups/size", at::scalar_tensor(static_cast<int64_t>(param_groups.size()), at::kLong));
  for (size_t i = 0; i < param_groups.size(); ++i) {
    const auto& g = param_groups[i];
    // Typed options only: libtorch's layout nests them as an archive, which bytes cannot become.
    if (!g.options)
      throw Error("OptimizerStateDict::save: parameter group " + std::to_string(i) +
                  " has no typed options (a dict read with torch::load keeps them as bytes: load it into an optimizer first)");
    OutputArchive group_archive(archive.compilation_unit());
    group_archive.write("params/size", at::scalar_tensor(static_cast<int64_t>(g.params.size()), at::kLong));
    for (size_t j = 0; j < g.params.size(); ++j)
      group_archive.write("params/" + std::to_string(j), c10::IValue(g.params[j]));
    OutputArchive options_archive(archive.compilation_unit());
    g.options->serialize(options_archive);
    group_archive.write("options", options_archive);
    groups_archive.write("param_groups/" + std::to_string(i), group_archive);
  }
  archive.write("param_groups", groups_archive);
}

std::string OptimizerStateDict::to_bytes() const {
  OutputArchive archive;
  save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

OptimizerStateDict OptimizerStateDict::load(InputArchive& archive, const torch::optim::OptimizerOptions& options_prototype,
                                            const StateFactory& make_state) {
  OptimizerStateDict sd;
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
        g.params.push_back(std::to_string(index++));
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
      // Into the optimizer's own state type first: it checks the entries and knows which are numbers.
      auto st = make_state();
      st->serialize(entry);
      sd.state[std::to_string(it->second)] = detail::param_state_entries(*st);
    }
  } catch (const c10::Error& e) {
    throw Error("reading an optimizer state dict: cannot read " + where + " as " +
                c10::demangle(typeid(options_prototype).name()) + "'s optimizer: " + e.what_without_backtrace());
  }
  return sd;
}

OptimizerStateDict OptimizerStateDict::from_bytes(const std::string& bytes,
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

// ---- torch::save / torch::load: every key, entries as StateDicts, options as bytes -----------

void operator<<(torch::serialize::OutputArchive& archive, const OptimizerStateDict& sd) {
  c10::List<std::string> keys;
  int64_t i = 0;
  for (const auto& [key, entries] : sd.state) {
    keys.push_back(key);
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    try {
      sub << entries;
    } catch (const Error& e) {
      throw Error("saving the optimizer state of '" + key + "': " + e.what());
    }
    archive.write("s" + std::to_string(i++), sub);
  }
  archive.write("fsdpp_optim_state_keys", c10::IValue(keys));
  archive.write("fsdpp_optim_param_groups", c10::IValue(static_cast<int64_t>(sd.param_groups.size())));
  for (size_t g = 0; g < sd.param_groups.size(); ++g) {
    const auto& group = sd.param_groups[g];
    torch::serialize::OutputArchive sub(archive.compilation_unit());
    c10::List<std::string> params;
    for (const auto& p : group.params) params.push_back(p);
    sub.write("params", c10::IValue(params));
    const std::string bytes = group.serialized_options();
    at::Tensor blob = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(blob.data_ptr(), bytes.data(), bytes.size());
    sub.write("options", blob);
    archive.write("g" + std::to_string(g), sub);
  }
}

void operator>>(torch::serialize::InputArchive& archive, OptimizerStateDict& sd) {
  c10::IValue keys, groups;
  if (!archive.try_read("fsdpp_optim_state_keys", keys) || !archive.try_read("fsdpp_optim_param_groups", groups))
    throw Error("loading an optimizer state dict with torch::load: not written from an fsdpp::OptimizerStateDict");
  OptimizerStateDict out;
  out.type = StateDictType::FULL_STATE_DICT;
  int64_t i = 0;
  for (const auto& k : keys.toListRef()) {
    torch::serialize::InputArchive sub;
    archive.read("s" + std::to_string(i++), sub);
    StateDict entries;
    sub >> entries;
    out.state.emplace(k.toStringRef(), std::move(entries));
  }
  for (int64_t g = 0; g < groups.toInt(); ++g) {
    torch::serialize::InputArchive sub;
    archive.read("g" + std::to_string(g), sub);
    OptimizerStateDict::ParamGroup group;
    c10::IValue params;
    sub.read("params", params);
    for (const auto& p : params.toListRef()) group.params.push_back(p.toStringRef());
    at::Tensor blob;
    sub.read("options", blob);
    blob = blob.contiguous();
    group.options_bytes.assign(static_cast<const char*>(blob.data_ptr()), static_cast<size_t>(blob.numel()));
    out.param_groups.push_back(std::move(group));
  }
  sd = std::move(out);
}

}  // namespace fsdpp

#include "optim/optimizer_state.h"

#include <sstream>
#include <typeinfo>

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <fsdpp/error.h>

#include "compat/optimizer_state_key.h"

namespace fsdpp::detail {

const torch::optim::OptimizerParamState* find_param_state(const torch::optim::Optimizer& optim,
                                                          const at::Tensor& param) {
  auto it = optim.state().find(compat::optimizer_state_key(param));
  return it == optim.state().end() ? nullptr : it->second.get();
}

std::string options_to_bytes(const torch::optim::OptimizerOptions& options) {
  torch::serialize::OutputArchive archive;
  options.serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::unique_ptr<torch::optim::OptimizerOptions> options_from_bytes(const torch::optim::OptimizerOptions& prototype,
                                                                   const std::string& bytes) {
  auto parsed = prototype.clone();
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  parsed->serialize(archive);
  return parsed;
}

StateDict param_state_entries(const torch::optim::OptimizerParamState& state) {
  // Through an archive: the state's serialize() is the one list of its fields libtorch has.
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream stream(bytes.str());
  in.load_from(stream);
  StateDict entries;
  for (const std::string& name : in.keys()) {
    c10::IValue v;
    if (!in.try_read(name, v)) continue;
    if (v.isTensor()) entries.insert(name, v.toTensor());
    else if (v.isInt()) entries.insert(name, at::scalar_tensor(v.toInt(), at::kLong));
    else if (v.isDouble()) entries.insert(name, at::scalar_tensor(v.toDouble(), at::kDouble));
    else if (v.isBool()) entries.insert(name, at::scalar_tensor(v.toBool(), at::kBool));
    else
      throw Error("optimizer state entry '" + name + "' of " + c10::demangle(typeid(state).name()) + " is a " +
                  v.tagKind() + ", neither a tensor nor a number");
  }
  return entries;
}

void write_param_state(const StateDict& entries, torch::serialize::OutputArchive& archive) {
  for (const auto& [name, value] : entries) {
    if (!value.is_tensor())
      throw Error("optimizer state entry '" + name + "' is a ShardedTensor; libtorch's archive holds whole tensors");
    const at::Tensor& t = value.tensor();
    if (t.dim() == 0 && t.scalar_type() == at::kLong) archive.write(name, c10::IValue(t.item<int64_t>()));
    else if (t.dim() == 0 && t.scalar_type() == at::kDouble) archive.write(name, c10::IValue(t.item<double>()));
    else if (t.dim() == 0 && t.scalar_type() == at::kBool) archive.write(name, c10::IValue(t.item<bool>()));
    else archive.write(name, c10::IValue(t));  // as libtorch's states write theirs
  }
}

std::unique_ptr<torch::optim::OptimizerParamState> param_state_from_entries(
    const StateDict& entries, std::unique_ptr<torch::optim::OptimizerParamState> fresh, c10::Device device,
    const std::function<void(const std::string& name, const at::Tensor& t)>& check) {
  for (const auto& [name, value] : entries)
    if (value.is_tensor()) check(name, value.tensor());
  // Through an archive as well: it moves the tensors to `device` and reads numbers as the
  // state's own types.
  torch::serialize::OutputArchive out;
  write_param_state(entries, out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream stream(bytes.str());
  in.load_from(stream, device);
  fresh->serialize(in);
  return fresh;
}

}  // namespace fsdpp::detail

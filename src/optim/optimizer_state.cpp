#include "optim/optimizer_state.h"

#include <sstream>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

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

}  // namespace fsdpp::detail

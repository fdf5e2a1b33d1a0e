#pragma once
// The checkpoint wrapper apply_activation_checkpointing puts in place of a Sequential element it
// knows only through its AnyModule: it takes and returns the Sequential's AnyValues.
#include <vector>

#include <torch/nn/modules/container/any.h>

namespace fsdpp::detail {

class AnyCheckpointWrapperImpl : public torch::nn::Module {
 public:
  explicit AnyCheckpointWrapperImpl(torch::nn::AnyModule module);
  torch::nn::AnyValue forward(std::vector<torch::nn::AnyValue> arguments);

 private:
  torch::nn::AnyModule module_;
};

}  // namespace fsdpp::detail

namespace torch::nn {

// AnyModule's holder for the wrapper: passes the Sequential's AnyValues through unchanged.
template <>
struct AnyModuleHolder<fsdpp::detail::AnyCheckpointWrapperImpl, std::vector<AnyValue>> : public AnyModulePlaceholder {
  explicit AnyModuleHolder(std::shared_ptr<fsdpp::detail::AnyCheckpointWrapperImpl>&& m)
      : AnyModulePlaceholder(typeid(fsdpp::detail::AnyCheckpointWrapperImpl)), module(std::move(m)) {}
  AnyValue forward(std::vector<AnyValue>&& arguments) override { return module->forward(std::move(arguments)); }
  std::shared_ptr<Module> ptr() override { return module; }
  std::unique_ptr<AnyModulePlaceholder> copy() const override { return std::make_unique<AnyModuleHolder>(*this); }
  std::unique_ptr<AnyModulePlaceholder> clone_module(optional<Device>) const override {
    AT_ERROR("a checkpoint wrapper cannot be cloned");
  }
  std::shared_ptr<fsdpp::detail::AnyCheckpointWrapperImpl> module;
};

}  // namespace torch::nn

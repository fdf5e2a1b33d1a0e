#pragma once
// The unit a type-blind wrap policy makes of a Sequential element: it knows the element only
// through its AnyModule and takes and returns AnyValues, so the Sequential calls it in place.
#include <vector>

#include <torch/nn/modules/container/any.h>

#include <fsdpp/fully_shard.h>

namespace fsdpp::detail {

class AnyModuleUnitImpl : public FSDPModule {
 public:
  AnyModuleUnitImpl(torch::nn::AnyModule module, FullyShardOptions options);
  torch::nn::AnyValue forward(std::vector<torch::nn::AnyValue> arguments);

 private:
  torch::nn::AnyModule module_;
};

}  // namespace fsdpp::detail

namespace torch::nn {

// AnyModule's holder for the unit: passes the Sequential's AnyValues through unchanged
// (the element checks their number and types itself).
template <>
struct AnyModuleHolder<fsdpp::detail::AnyModuleUnitImpl, std::vector<AnyValue>> : public AnyModulePlaceholder {
  explicit AnyModuleHolder(std::shared_ptr<fsdpp::detail::AnyModuleUnitImpl>&& m)
      : AnyModulePlaceholder(typeid(fsdpp::detail::AnyModuleUnitImpl)), module(std::move(m)) {}
  AnyValue forward(std::vector<AnyValue>&& arguments) override { return module->forward(std::move(arguments)); }
  std::shared_ptr<Module> ptr() override { return module; }
  std::unique_ptr<AnyModulePlaceholder> copy() const override { return std::make_unique<AnyModuleHolder>(*this); }
  std::unique_ptr<AnyModulePlaceholder> clone_module(optional<Device>) const override {
    AT_ERROR("an FSDP unit cannot be cloned");
  }
  std::shared_ptr<fsdpp::detail::AnyModuleUnitImpl> module;
};

}  // namespace torch::nn

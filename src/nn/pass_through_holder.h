#pragma once
// AnyModule's holder for a type-blind wrapper whose forward takes the Sequential's values as they
// are (std::vector<AnyValue>): the element being wrapped checks their number and types itself.
#include <memory>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <torch/nn/modules/container/any.h>

namespace fsdpp::detail {

template <typename Wrapper>
struct PassThroughHolder : public torch::nn::AnyModulePlaceholder {
  explicit PassThroughHolder(std::shared_ptr<Wrapper>&& m)
      : torch::nn::AnyModulePlaceholder(typeid(Wrapper)), module(std::move(m)) {}
  torch::nn::AnyValue forward(std::vector<torch::nn::AnyValue>&& arguments) override {
    return module->forward(std::move(arguments));
  }
  std::shared_ptr<torch::nn::Module> ptr() override { return module; }
  std::unique_ptr<torch::nn::AnyModulePlaceholder> copy() const override {
    return std::make_unique<PassThroughHolder>(*this);
  }
  std::unique_ptr<torch::nn::AnyModulePlaceholder> clone_module(c10::optional<torch::Device>) const override {
    AT_ERROR(c10::demangle(typeid(Wrapper).name()), " cannot be cloned");
  }
  std::shared_ptr<Wrapper> module;
};

}  // namespace fsdpp::detail

// Makes PassThroughHolder AnyModule's holder for Wrapper (a class in fsdpp::detail whose
// forward takes and returns the Sequential's AnyValues). At namespace scope.
#define FSDPP_PASS_THROUGH_ANY_MODULE(Wrapper)                                                     \
  template <>                                                                                      \
  struct torch::nn::AnyModuleHolder<fsdpp::detail::Wrapper, std::vector<torch::nn::AnyValue>>     \
      : fsdpp::detail::PassThroughHolder<fsdpp::detail::Wrapper> {                                 \
    using PassThroughHolder::PassThroughHolder;                                                    \
  }

#include "fsdp/any_module_unit.h"

#include <optional>
#include <utility>

#include <fsdpp/error.h>

namespace fsdpp::detail {

AnyModuleUnitImpl::AnyModuleUnitImpl(torch::nn::AnyModule module, FullyShardOptions options)
    : FSDPModule(module.ptr(), std::move(options)), module_(std::move(module)) {}

namespace {

template <size_t... I>
torch::nn::AnyValue call(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue>& a, std::index_sequence<I...>) {
  return m.any_forward(std::move(a[I])...);
}

torch::nn::AnyValue call(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue>& a) {
  switch (a.size()) {
    case 0: return m.any_forward();
    case 1: return call(m, a, std::make_index_sequence<1>{});
    case 2: return call(m, a, std::make_index_sequence<2>{});
    case 3: return call(m, a, std::make_index_sequence<3>{});
    case 4: return call(m, a, std::make_index_sequence<4>{});
    case 5: return call(m, a, std::make_index_sequence<5>{});
    case 6: return call(m, a, std::make_index_sequence<6>{});
    default:
      throw Error("FSDP unit of " + m.ptr()->name() + ": forward with " + std::to_string(a.size()) +
                  " arguments; a Sequential element wrapped by a size-based policy takes at most 6");
  }
}

}  // namespace

torch::nn::AnyValue AnyModuleUnitImpl::forward(std::vector<torch::nn::AnyValue> arguments) {
  std::vector<at::Tensor*> inputs;
  for (auto& a : arguments)
    if (auto* t = a.try_get<at::Tensor>()) inputs.push_back(t);
  std::optional<torch::nn::AnyValue> output;
  forward_steps(inputs, [&] {
    output.emplace(call(module_, arguments));
    auto* t = output->try_get<at::Tensor>();
    return t ? std::vector<at::Tensor*>{t} : std::vector<at::Tensor*>{};
  });
  return std::move(*output);
}

}  // namespace fsdpp::detail

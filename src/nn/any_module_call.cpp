#include "nn/any_module_call.h"

#include <utility>

#include <fsdpp/error.h>

namespace fsdpp::detail {
namespace {

template <size_t... I>
torch::nn::AnyValue call(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue>& a, std::index_sequence<I...>) {
  return m.any_forward(std::move(a[I])...);
}

}  // namespace

torch::nn::AnyValue call_any_module(torch::nn::AnyModule& m, std::vector<torch::nn::AnyValue>& a, const std::string& who) {
  switch (a.size()) {
    case 0: return m.any_forward();
    case 1: return call(m, a, std::make_index_sequence<1>{});
    case 2: return call(m, a, std::make_index_sequence<2>{});
    case 3: return call(m, a, std::make_index_sequence<3>{});
    case 4: return call(m, a, std::make_index_sequence<4>{});
    case 5: return call(m, a, std::make_index_sequence<5>{});
    case 6: return call(m, a, std::make_index_sequence<6>{});
    default:
      throw Error(who + ": forward with " + std::to_string(a.size()) +
                  " arguments; a Sequential element wrapped by a type-blind policy takes at most 6");
  }
}

}  // namespace fsdpp::detail

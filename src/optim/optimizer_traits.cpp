// The rows of optimizer_traits.h for libtorch's SGD, Adam, AdamW, Adagrad and RMSprop.
#include "optim/optimizer_traits.h"

#include <typeinfo>

#include <ATen/ATen.h>
#include <c10/util/Type.h>

#include <fsdpp/error.h>
#include <fsdpp/optimizer_traits.h>

namespace fsdpp::detail {
namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;

template <typename O>
using StateOf = typename OptimizerTraits<O>::ParamState;
template <typename O>
using OptionsOf = typename OptimizerTraits<O>::Options;

template <typename O>
const StateOf<O>& state_of(const OptimizerParamState& s) {
  return static_cast<const StateOf<O>&>(s);
}
template <typename O>
const OptionsOf<O>& options_of(const OptimizerOptions& o) {
  return static_cast<const OptionsOf<O>&>(o);
}

using Tensors = std::vector<at::Tensor>;

at::Tensor zeros(const at::Tensor& p) { return at::zeros_like(p.detach(), at::MemoryFormat::Preserve); }

// A row from what differs between optimizers: how a state's tensors map to `entries` (get, set)
// and what the first step creates (initial). Every optimizer but SGD counts steps.
template <typename O, typename Get, typename Set, typename Initial>
OptimizerStateTraits row(std::vector<std::string> entries, std::vector<std::string> required, Get get, Set set,
                         Initial initial) {
  constexpr bool counts_steps = !std::is_same_v<O, torch::optim::SGD>;
  OptimizerStateTraits t;
  t.entries = std::move(entries);
  t.required = std::move(required);
  t.has_step = counts_steps;
  t.matches = [](const torch::optim::Optimizer& o) { return dynamic_cast<const O*>(&o) != nullptr; };
  t.tensors = [get](const OptimizerParamState& s) { return get(state_of<O>(s)); };
  t.step = [](const OptimizerParamState& s) -> int64_t {
    if constexpr (counts_steps) return state_of<O>(s).step();
    return 0;
  };
  t.make = [set](const Tensors& v, int64_t step) -> std::unique_ptr<OptimizerParamState> {
    auto s = std::make_unique<StateOf<O>>();
    if constexpr (counts_steps) s->step(step);
    set(*s, v);
    return s;
  };
  t.initial = [initial](const OptimizerOptions& o, const at::Tensor& p) { return initial(options_of<O>(o), p); };
  return t;
}

OptimizerStateTraits sgd() {
  return row<torch::optim::SGD>(
      {"momentum_buffer"}, {"momentum_buffer"}, [](const auto& s) { return Tensors{s.momentum_buffer()}; },
      [](auto& s, const Tensors& v) { s.momentum_buffer(v[0]); },
      // Without momentum SGD keeps no state.
      [](const auto& o, const at::Tensor& p) { return o.momentum() == 0 ? Tensors{} : Tensors{zeros(p)}; });
}

// Adam and AdamW keep the same state.
template <typename O>
OptimizerStateTraits adam_like() {
  return row<O>(
      {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"exp_avg", "exp_avg_sq"},
      [](const auto& s) { return Tensors{s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()}; },
      [](auto& s, const Tensors& v) { s.exp_avg(v[0]).exp_avg_sq(v[1]).max_exp_avg_sq(v[2]); },
      [](const auto& o, const at::Tensor& p) {
        return Tensors{zeros(p), zeros(p), o.amsgrad() ? zeros(p) : at::Tensor()};
      });
}

OptimizerStateTraits adagrad() {
  return row<torch::optim::Adagrad>(
      {"sum"}, {"sum"}, [](const auto& s) { return Tensors{s.sum()}; },
      [](auto& s, const Tensors& v) { s.sum(v[0]); },
      [](const auto& o, const at::Tensor& p) { return Tensors{at::full_like(p.detach(), o.initial_accumulator_value())}; });
}

OptimizerStateTraits rmsprop() {
  return row<torch::optim::RMSprop>(
      {"square_avg", "momentum_buffer", "grad_avg"}, {"square_avg"},
      [](const auto& s) { return Tensors{s.square_avg(), s.momentum_buffer(), s.grad_avg()}; },
      [](auto& s, const Tensors& v) { s.square_avg(v[0]).momentum_buffer(v[1]).grad_avg(v[2]); },
      [](const auto& o, const at::Tensor& p) {
        return Tensors{zeros(p), o.momentum() > 0 ? zeros(p) : at::Tensor(), o.centered() ? zeros(p) : at::Tensor()};
      });
}

}  // namespace

const OptimizerStateTraits& optimizer_state_traits(const torch::optim::Optimizer& optim) {
  static const std::vector<OptimizerStateTraits> table{adam_like<torch::optim::Adam>(),
                                                       adam_like<torch::optim::AdamW>(), sgd(), adagrad(),
                                                       rmsprop()};
  for (const auto& t : table)
    if (t.matches(optim)) return t;
  throw Error("optimizer state dicts: unsupported optimizer " + c10::demangle(typeid(optim).name()) +
              " (supported: SGD, Adam, AdamW, Adagrad, RMSprop)");
}

}  // namespace fsdpp::detail

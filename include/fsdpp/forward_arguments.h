#pragma once
// What the module wrappers (FSDP units, checkpoint wrappers) share: the wrapped module's forward
// signature and the tensors inside a forward's arguments or result.
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::nn {
class SequentialImpl;
}

namespace fsdpp::detail {

// The signature of M::forward as a function type; specialize for modules whose forward is a
// template (Sequential: Tensor(Tensor)), or pass the signature to FullyShardedDataParallel.
template <typename T>
struct forward_signature : forward_signature<decltype(&T::forward)> {};
template <typename C, typename R, typename... A>
struct forward_signature<R (C::*)(A...)> {
  using type = R(A...);
};
template <typename C, typename R, typename... A>
struct forward_signature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <>
struct forward_signature<torch::nn::SequentialImpl> {
  using type = at::Tensor(at::Tensor);
};

// Visits the tensors in a forward's arguments or result: a Tensor, a vector of them, a tuple
// or pair (nested); anything else holds none.
template <typename T, typename F>
void for_each_tensor(T&, F&) {}
template <typename F>
void for_each_tensor(at::Tensor& t, F& f) {
  f(t);
}
template <typename F>
void for_each_tensor(std::vector<at::Tensor>& ts, F& f) {
  for (auto& t : ts) f(t);
}
template <typename... Ts, typename F>
void for_each_tensor(std::tuple<Ts...>& t, F& f);
template <typename A, typename B, typename F>
void for_each_tensor(std::pair<A, B>& p, F& f);
template <typename... Ts, typename F>
void for_each_tensor(std::tuple<Ts...>& t, F& f) {
  std::apply([&](auto&... e) { (for_each_tensor(e, f), ...); }, t);
}
template <typename A, typename B, typename F>
void for_each_tensor(std::pair<A, B>& p, F& f) {
  for_each_tensor(p.first, f);
  for_each_tensor(p.second, f);
}

// Pointers to the tensors in a forward's arguments or result.
template <typename T>
std::vector<at::Tensor*> tensors_in(T& value) {
  std::vector<at::Tensor*> out;
  auto collect = [&](at::Tensor& t) { out.push_back(&t); };
  for_each_tensor(value, collect);
  return out;
}


// Whether a value of type T (decayed) can hold a tensor for for_each_tensor to visit.
template <typename T>
struct may_hold_tensor : std::false_type {};
template <>
struct may_hold_tensor<at::Tensor> : std::true_type {};
template <>
struct may_hold_tensor<std::vector<at::Tensor>> : std::true_type {};
template <typename... Ts>
struct may_hold_tensor<std::tuple<Ts...>> : std::disjunction<may_hold_tensor<std::decay_t<Ts>>...> {};
template <typename A, typename B>
struct may_hold_tensor<std::pair<A, B>>
    : std::disjunction<may_hold_tensor<std::decay_t<A>>, may_hold_tensor<std::decay_t<B>>> {};

}  // namespace fsdpp::detail

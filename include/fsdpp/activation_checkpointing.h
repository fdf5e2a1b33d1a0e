#pragma once
// Activation checkpointing for the C++ frontend (PyTorch's checkpoint_wrapper and
// apply_activation_checkpointing; libtorch has no torch.utils.checkpoint): the wrapped module's
// forward keeps no activations; backward runs it again, with the same RNG state, and
// backpropagates through the recomputation.
//
//   auto block = fsdpp::checkpoint_wrapper(Block(args));          // forward signature unchanged
//   fsdpp::apply_activation_checkpointing(*model, fsdpp::ModuleWrapPolicy<BlockImpl>());
//
// It is torch.utils.checkpoint's reentrant scheme (libtorch has no saved-tensor hooks for the
// non-reentrant one), with its hole closed: outputs require grad even when no input does (token
// ids), so the wrapped module's parameters still get gradients.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <fsdpp/error.h>
#include <fsdpp/forward_arguments.h>

namespace fsdpp {

namespace detail {

// The tensors `run(inputs)` returns, computed without keeping activations when grad mode is on:
// backward calls `run` again on detached copies of the inputs (CPU RNG state as in forward) and
// backpropagates through it. Without grad mode, run(inputs) as it is.
std::vector<at::Tensor> checkpointed_call(const std::vector<at::Tensor>& inputs,
                                          std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> run);

// module->forward(inputs...) (R(A...) its signature) under checkpointed_call: what
// checkpoint_wrapper and an FSDP unit checkpointing its wrapped module both run.
template <typename Signature>
struct CheckpointedForward;
template <typename R, typename... A>
struct CheckpointedForward<R(A...)> {
  using Inputs = std::tuple<std::decay_t<A>...>;
  template <typename M>
  static R call(std::shared_ptr<M> module, Inputs inputs) {
    std::vector<at::Tensor> tensors;
    for (at::Tensor* t : tensors_in(inputs)) tensors.push_back(*t);
    // Each call of `run` (forward, then the recompute in backward) puts the given tensors into a
    // copy of the arguments; the first call keeps the result, whose tensors become the outputs.
    std::optional<R> result;
    auto run = [module, inputs, &result, first = true](const std::vector<at::Tensor>& values) mutable {
      Inputs call = inputs;
      auto slots = tensors_in(call);
      for (size_t i = 0; i < slots.size(); ++i) *slots[i] = values[i];
      R out = std::apply([&](auto&... a) { return module->forward(static_cast<A&&>(a)...); }, call);
      std::vector<at::Tensor> out_tensors;
      for (at::Tensor* t : tensors_in(out)) out_tensors.push_back(*t);
      if (first) result.emplace(std::move(out));
      first = false;
      return out_tensors;
    };
    std::vector<at::Tensor> outputs = checkpointed_call(tensors, run);
    auto slots = tensors_in(*result);
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = outputs[i];
    return std::move(*result);
  }
};

template <typename Derived, typename Signature>
class CheckpointForward;
template <typename Derived, typename R, typename... A>
class CheckpointForward<Derived, R(A...)> {
 public:
  R forward(A... args) {
    return CheckpointedForward<R(A...)>::call(static_cast<Derived*>(this)->typed_,
                                              std::tuple<std::decay_t<A>...>(std::forward<A>(args)...));
  }
};

}  // namespace detail

// The module checkpoint_wrapper makes: `forward` has exactly M::forward's signature, which must
// take at least one tensor (a Tensor, or a vector, tuple or pair holding them) and return some.
// The wrapped module is registered as `_checkpoint_wrapped_module` (PyTorch's name); state dicts
// leave that segment out of their keys.
template <typename M, typename Signature = typename detail::forward_signature<M>::type>
class CheckpointWrapperImpl;
template <typename M, typename R, typename... A>
class CheckpointWrapperImpl<M, R(A...)> : public torch::nn::Module,
                                           public detail::CheckpointForward<CheckpointWrapperImpl<M, R(A...)>, R(A...)> {
 public:
  explicit CheckpointWrapperImpl(std::shared_ptr<M> module) : typed_(std::move(module)) {
    static_assert(detail::may_hold_tensor<std::tuple<std::decay_t<A>...>>::value,
                  "checkpoint_wrapper: the module's forward takes no tensor, so there is nothing to recompute from");
    if (!typed_) throw Error("checkpoint_wrapper: the module is null");
    register_module("_checkpoint_wrapped_module", typed_);
  }
  explicit CheckpointWrapperImpl(torch::nn::ModuleHolder<M> module) : CheckpointWrapperImpl(module.ptr()) {}

  using detail::CheckpointForward<CheckpointWrapperImpl<M, R(A...)>, R(A...)>::forward;
  const std::shared_ptr<M>& module() const { return typed_; }

 private:
  friend class detail::CheckpointForward<CheckpointWrapperImpl<M, R(A...)>, R(A...)>;
  std::shared_ptr<M> typed_;
};

template <typename M, typename Signature = typename detail::forward_signature<M>::type>
class CheckpointWrapper : public torch::nn::ModuleHolder<CheckpointWrapperImpl<M, Signature>> {
 public:
  using torch::nn::ModuleHolder<CheckpointWrapperImpl<M, Signature>>::ModuleHolder;
};

// PyTorch's checkpoint_wrapper(module): use the result in the module's place.
template <typename M>
CheckpointWrapper<M> checkpoint_wrapper(torch::nn::ModuleHolder<M> module) {
  return CheckpointWrapper<M>(module.ptr());
}
template <typename M>
CheckpointWrapper<M> checkpoint_wrapper(std::shared_ptr<M> module) {
  return CheckpointWrapper<M>(std::move(module));
}

}  // namespace fsdpp

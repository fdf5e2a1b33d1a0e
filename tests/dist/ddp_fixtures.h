#pragma once
// The DDP tests' shared model: Linear(6, 8) -> tanh -> Linear(8, 8) -> tanh -> Linear(8, 3),
// with two identities whose backwards let a test see and steer when gradients are ready.
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include <torch/torch.h>

namespace fsdpp::testing {

inline constexpr int64_t kIn = 6, kHidden = 8, kOut = 3;

// bucket_cap_mb that holds exactly `floats` float32 values.
inline double cap_of_floats(int64_t floats) { return static_cast<double>(floats * 4) / (1024.0 * 1024.0); }

// Identity whose backward waits (up to 10 s) until `done()` says so: stands in for expensive
// layers, long enough for a bucket's reduction to finish, without depending on timing.
struct WaitInBackward : torch::autograd::Function<WaitInBackward> {
  static inline std::function<bool()> done;
  static inline std::function<void()> reached;  // called when backward gets here
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    if (reached) reached();
    for (int i = 0; i < 1000 && done && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return {g[0]};
  }
};

// Identity at the model input: its backward runs last, after every parameter's gradient (only
// when the input requires grad).
struct ProbeAtInput : torch::autograd::Function<ProbeAtInput> {
  static inline std::function<void()> reached;
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.clone(); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    if (reached) reached();
    return {g[0]};
  }
};

// Backward runs l3, the wait, l2, l1, then the probe. Parameters in reverse registration order
// (DDP's bucket order): l3.bias 3, l3.weight 24, l2.bias 8, l2.weight 64, l1.bias 8, l1.weight 48.
struct ThreeLayersImpl : torch::nn::Module {
  ThreeLayersImpl() {
    l1 = register_module("l1", torch::nn::Linear(kIn, kHidden));
    l2 = register_module("l2", torch::nn::Linear(kHidden, kHidden));
    l3 = register_module("l3", torch::nn::Linear(kHidden, kOut));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = torch::tanh(l2(torch::tanh(l1(ProbeAtInput::apply(x)))));
    return l3(WaitInBackward::apply(h));
  }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(ThreeLayers);

}  // namespace fsdpp::testing

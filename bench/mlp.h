#pragma once
// The benchmarks' model: a stack of Linear+ReLU layers, the same in bench_ddp.py.
#include <torch/torch.h>

struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t hidden, int64_t layers) {
    for (int64_t i = 0; i < layers; ++i) {
      body->push_back(torch::nn::Linear(hidden, hidden));
      body->push_back(torch::nn::ReLU());
    }
    register_module("body", body);
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  torch::nn::Sequential body;
};
TORCH_MODULE(MLP);

#pragma once
// A forward pass written down as ops, for counting memory: each op allocates one output, may
// save tensors for its backward (its inputs, its own output, or extra bytes such as a layer
// norm's mean and rstd) and produces parameter gradients in its backward. From this the step
// replay (step_replay.h) knows when autograd allocates and frees each tensor: a forward tensor
// lives until its last use (or a C++ local holding it ends), or until the backward of the last
// op that saved it; the gradient of a tensor lives from the backward of its first consumer (in
// backward order) to the backward of its producer.
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp::plan::detail {

struct TapeTensor {
  int64_t bytes = 0;
  bool requires_grad = true;
  int producer = -1;
  int hold_until = -1;  // op index until which a C++ local keeps it alive
};

struct TapeOp {
  std::string name;
  int unit = -1;  // FSDP unit (0 = the root), -1 for ops outside every unit (the loss)
  std::vector<int> inputs;
  std::vector<int> saves;         // tensor ids kept for backward
  int output = -1;
  int64_t saved_extra = 0;        // bytes kept for backward beside the tensors (mean, rstd, ...)
  int64_t forward_temp = 0;       // bytes alive only while the op runs forward
  int64_t param_grad_bytes = 0;   // gradients of the op's parameters, made in its backward
  bool param_grad_accumulates = false;  // into a gradient that exists already (tied weights)
  // An addition: its backward hands the output's gradient on to the inputs of the same shape
  // (no new tensor); a broadcast input gets its sum.
  bool grad_passes_through = false;
};

class Tape {
 public:
  // A tensor made by an op from `inputs`; returns its id.
  int op(const std::string& name, int64_t bytes, std::vector<int> inputs, std::vector<int> saves = {},
         int64_t param_grad_bytes = 0);
  // The output of the last op is saved by that op itself (softmax, log_softmax, SDPA).
  void saves_own_output();
  void last_op_saves_extra(int64_t bytes) { ops_.back().saved_extra += bytes; }
  void last_op_forward_temp(int64_t bytes) { ops_.back().forward_temp += bytes; }
  void last_op_accumulates_param_grad() { ops_.back().param_grad_accumulates = true; }
  void last_op_passes_grad_through() { ops_.back().grad_passes_through = true; }
  void no_grad(int tensor) { tensors_[tensor].requires_grad = false; }
  // A C++ local keeps `tensor` alive until op `op_index` has run.
  void hold(int tensor, int op_index) { tensors_[tensor].hold_until = op_index; }
  void set_unit(int unit) { unit_ = unit; }
  int last_op() const { return static_cast<int>(ops_.size()) - 1; }

  const std::vector<TapeOp>& ops() const { return ops_; }
  const std::vector<TapeTensor>& tensors() const { return tensors_; }

 private:
  std::vector<TapeOp> ops_;
  std::vector<TapeTensor> tensors_;
  int unit_ = -1;
};

}  // namespace fsdpp::plan::detail

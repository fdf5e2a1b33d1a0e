#include "plan/autograd_tape.h"

#include <utility>

namespace fsdpp::plan::detail {

int Tape::op(const std::string& name, int64_t bytes, std::vector<int> inputs, std::vector<int> saves,
             int64_t param_grad_bytes) {
  TapeOp o;
  o.name = name;
  o.unit = unit_;
  o.inputs = std::move(inputs);
  o.saves = std::move(saves);
  o.param_grad_bytes = param_grad_bytes;
  o.output = static_cast<int>(tensors_.size());
  TapeTensor t;
  t.bytes = bytes;
  t.producer = static_cast<int>(ops_.size());
  tensors_.push_back(t);
  ops_.push_back(std::move(o));
  return ops_.back().output;
}

void Tape::saves_own_output() { ops_.back().saves.push_back(ops_.back().output); }

}  // namespace fsdpp::plan::detail

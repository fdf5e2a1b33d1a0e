// The autograd function behind checkpoint_wrapper: forward without saving activations, backward
// by recomputation (torch.utils.checkpoint's reentrant scheme).
#include <fsdpp/activation_checkpointing.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace fsdpp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Run = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// What backward needs, kept in the autograd graph (as a capsule: AutogradContext's saved data
// holds IValues).
struct Recompute : torch::CustomClassHolder {
  Run run;
  std::vector<bool> input_requires_grad;
  at::Tensor rng_state;  // the CPU generator's state when forward ran
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  // `args`: the inputs, then a dummy that requires grad (so the outputs always do). A TensorList,
  // not a vector: autograd::Function counts only those (and tensors) as its inputs.
  static variable_list forward(AutogradContext* ctx, at::TensorList args, c10::intrusive_ptr<Recompute> recompute) {
    std::vector<at::Tensor> inputs(args.begin(), args.end() - 1);
    for (const auto& t : inputs) recompute->input_requires_grad.push_back(t.defined() && t.requires_grad());
    recompute->rng_state = at::detail::getDefaultCPUGenerator().get_state();
    ctx->save_for_backward(inputs);
    std::vector<at::Tensor> outputs;
    {
      torch::NoGradGuard no_grad;
      outputs = recompute->run(inputs);
    }
    std::vector<at::Tensor> non_differentiable;
    for (auto& t : outputs) {
      // An output that is an input (or a view of one) would be modified by the autograd
      // machinery; hand back a distinct tensor.
      for (const auto& in : inputs)
        if (t.defined() && in.defined() && t.is_same(in)) t = t.clone();
      if (t.defined() && !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()))
        non_differentiable.push_back(t);
    }
    ctx->mark_non_differentiable(non_differentiable);
    // An output backward never reached gets no zeros: its branch leaves no gradient, as without
    // checkpointing.
    ctx->set_materialize_grads(false);
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(recompute);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor t = saved[i].defined() ? saved[i].detach() : saved[i];
      if (recompute->input_requires_grad[i]) t.requires_grad_(true);
      inputs.push_back(t);
    }
    // The recomputation draws the same random numbers as forward (dropout); the caller's
    // generator state is put back afterwards.
    auto generator = at::detail::getDefaultCPUGenerator();
    const at::Tensor caller_state = generator.get_state();
    generator.set_state(recompute->rng_state);
    std::vector<at::Tensor> outputs;
    {
      torch::AutoGradMode grad_on(true);
      outputs = recompute->run(inputs);
    }
    generator.set_state(caller_state);
    std::vector<at::Tensor> roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i)
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    // Reentrant: parameters' .grad accumulate as usual (FSDP units inside see theirs).
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    for (size_t i = 0; i < inputs.size(); ++i)
      result.push_back(recompute->input_requires_grad[i] ? inputs[i].grad() : at::Tensor());
    result.emplace_back();  // the dummy
    result.emplace_back();  // the Recompute argument
    return result;
  }
};

}  // namespace

std::vector<at::Tensor> checkpointed_call(const std::vector<at::Tensor>& inputs, Run run) {
  if (!torch::autograd::GradMode::is_enabled()) return run(inputs);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->run = std::move(run);
  variable_list args(inputs.begin(), inputs.end());
  args.push_back(at::empty({0}).requires_grad_(true));
  return CheckpointFunction::apply(at::TensorList(args), recompute);
}

}  // namespace fsdpp::detail

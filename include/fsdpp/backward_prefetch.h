#pragma once
// FSDP1's BackwardPrefetch: when a unit starts the all-gather of the unit whose backward runs
// after its own.
namespace fsdpp {

enum class BackwardPrefetch {
  // At the start of this unit's backward (PyTorch's default, and FSDP2's only choice): the
  // gather overlaps this unit's whole backward, but the unit's parameters, its gradients and
  // the prefetched parameters are then alive together.
  BACKWARD_PRE,
  // After this unit's backward, once its parameters are freed and before its reduce-scatter:
  // the gather overlaps packing and the reduce-scatter, not compute, and at most one unit's
  // parameters are prefetched beside one unit's gradients.
  BACKWARD_POST,
};

}  // namespace fsdpp

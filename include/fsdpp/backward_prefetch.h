#pragma once
// FSDP1's BackwardPrefetch: when a unit starts the all-gather of the unit whose backward runs
// after its own.
namespace fsdpp {

enum class BackwardPrefetch {
  // At the start of this unit's backward (PyTorch's default, and FSDP2's only choice): the
  // gather overlaps this unit's whole backward, but the unit's parameters, its gradients and
  // the prefetched parameters are then alive together.
  BACKWARD_PRE,
  // In this unit's post-backward, once its parameters are freed and its gradients packed into
  // the reduce-scatter input: the gather overlaps no backward compute, and that reduce-scatter
  // waits behind it on the comm thread, so its input (one unit) is still alive when the target
  // unit's backward starts. The parameters, gradients and prefetch of BACKWARD_PRE never
  // coexist, but the peak is lower only if that reduce-scatter finishes before the target's
  // first gradients exist (docs/benchmarks.md measures it).
  BACKWARD_POST,
};

}  // namespace fsdpp

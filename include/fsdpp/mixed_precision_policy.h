#pragma once
// fsdpp::MixedPrecisionPolicy (FSDP2's MixedPrecisionPolicy): the dtypes an FSDP unit computes,
// communicates and returns in, while its sharded parameters, their gradients and the optimizer
// state keep the parameters' own dtype (float32 as a rule).
//
//   auto opts = fsdpp::FullyShardOptions().mp_policy(
//       fsdpp::MixedPrecisionPolicy().param_dtype(at::kBFloat16).reduce_dtype(at::kFloat));
#include <optional>
#include <string>

#include <c10/core/ScalarType.h>

namespace fsdpp {

struct MixedPrecisionPolicy {
  // The dtype of the unsharded parameters the module computes with; the all-gather moves this
  // dtype (half the bytes of float32 for bfloat16 / float16). Unset: the parameters' dtype.
  MixedPrecisionPolicy& param_dtype(at::ScalarType v) { param_dtype_ = v; return *this; }
  // The dtype gradients are reduce-scattered in, before they land in the sharded `.grad` in the
  // parameters' dtype. Unset: param_dtype (the dtype autograd produced them in).
  MixedPrecisionPolicy& reduce_dtype(at::ScalarType v) { reduce_dtype_ = v; return *this; }
  // Floating-point tensors the unit's forward returns are cast to this dtype. Unset: as computed.
  MixedPrecisionPolicy& output_dtype(at::ScalarType v) { output_dtype_ = v; return *this; }
  // Floating-point tensors passed to the unit's forward are cast to param_dtype (when set).
  MixedPrecisionPolicy& cast_forward_inputs(bool v) { cast_forward_inputs_ = v; return *this; }

  std::optional<at::ScalarType> param_dtype_;
  std::optional<at::ScalarType> reduce_dtype_;
  std::optional<at::ScalarType> output_dtype_;
  bool cast_forward_inputs_ = true;

  // Throws naming `unit` if a dtype set is not floating point.
  void check(const std::string& unit) const;
};

}  // namespace fsdpp

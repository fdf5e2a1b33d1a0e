// comm/transport_dtypes.h: Gloo's and NCCL's dtypes.
#include "comm/transport_dtypes.h"

#include <ATen/ATen.h>

namespace fsdpp::detail {

at::Tensor as_wire(const at::Tensor& t) {
  at::Tensor flat = t.reshape({-1});
  switch (t.element_size()) {
    case 1: return flat.view(at::kByte);
    case 2: return flat.view(at::kHalf);
    case 4: return flat.view(at::kInt);
    default: return flat.view(at::kLong);
  }
}

bool gloo_can_reduce(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kChar: case at::kByte: case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

bool nccl_can_reduce(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kChar: case at::kByte:
    case at::kInt: case at::kLong:
      return true;
    default:
      return false;
  }
}

bool nccl_can_move(at::ScalarType t) {
  if (nccl_can_reduce(t) || t == at::kBool) return true;
  // c10d maps the float8 types to ncclUint8 for the collectives that move them.
  return t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2fnuz || t == at::kFloat8_e4m3fnuz;
}

at::Tensor as_nccl_wire(const at::Tensor& t) {
  at::Tensor flat = t.reshape({-1});
  return nccl_can_move(t.scalar_type()) ? flat : flat.view(at::kByte);
}

at::ScalarType widened(at::ScalarType t) { return at::isFloatingType(t) ? at::kFloat : at::kLong; }

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    default: return c10d::ReduceOp::SUM;  // AVG divides afterwards
  }
}

}  // namespace fsdpp::detail

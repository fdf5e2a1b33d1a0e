#include "tensor_parallel/tp_collectives.h"

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

namespace fsdpp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs (AutogradContext's saved data holds IValues, so a capsule).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ProcessGroup g, int64_t e = 0) : group(std::move(g)), extent(e) {}
  ProcessGroup group;
  int64_t extent;  // the gathered last dim's global size
};

c10::intrusive_ptr<GroupCapsule> capsule_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupCapsule>(ctx->saved_data["group"].toCapsule());
}

// torch.chunk's part of `extent` slices on `rank` of `n`.
int64_t chunk_of(int64_t extent, int n) { return (extent + n - 1) / n; }
int64_t part_size(int64_t extent, int n, int rank) {
  const int64_t c = chunk_of(extent, n);
  return std::max<int64_t>(0, std::min(c, extent - rank * c));
}
int64_t part_offset(int64_t extent, int n, int rank) { return std::min(rank * chunk_of(extent, n), extent); }

at::Tensor all_reduced(const at::Tensor& x, const ProcessGroup& group) {
  at::Tensor out = x.contiguous().clone();
  if (group.size() > 1) all_reduce(out, ReduceOp::SUM, group);
  return out;
}

at::Tensor gathered(const at::Tensor& x, int64_t extent, const ProcessGroup& group) {
  const int n = group.size();
  const int64_t mine = part_size(extent, n, group.rank());
  if (x.dim() == 0 || x.size(-1) != mine)
    throw Error("tensor parallel: a last-dim-sharded activation of shape " + c10::str(x.sizes()) + " on TP rank " +
                std::to_string(group.rank()) + " of " + std::to_string(n) + ": expected " + std::to_string(mine) +
                " of " + std::to_string(extent) + " features in its last dim");
  if (n == 1) return x.contiguous().clone();
  // Equal-sized parts on the wire (the collective needs them): pad to the chunk size.
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = chunk_of(extent, n);
  at::Tensor padded = at::zeros(shape, x.options());
  padded.narrow(-1, 0, mine).copy_(x);
  shape.insert(shape.begin(), n);
  at::Tensor all = at::empty(shape, x.options());
  all_gather_into_tensor(all, padded, group);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(all[r].narrow(-1, 0, part_size(extent, n, r)));
  return at::cat(parts, -1);
}

at::Tensor own_part(const at::Tensor& x, const ProcessGroup& group) {
  const int n = group.size(), r = group.rank();
  const int64_t extent = x.size(-1);
  return x.narrow(-1, part_offset(extent, n, r), part_size(extent, n, r)).contiguous().clone();
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupCapsule> g) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], capsule_of(ctx)->group), at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::intrusive_ptr<GroupCapsule> g) {
    return all_reduced(x, g->group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupCapsule> g) {
    at::Tensor out = gathered(x, g->extent, g->group);
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {own_part(grads[0], capsule_of(ctx)->group), at::Tensor()};
  }
};

struct SplitLastDim : torch::autograd::Function<SplitLastDim> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<GroupCapsule> g) {
    at::Tensor out = own_part(x, g->group);
    g->extent = x.size(-1);
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(g));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = capsule_of(ctx);
    return {gathered(grads[0], g->extent, g->group), at::Tensor()};
  }
};

}  // namespace

at::Tensor tp_copy_to_parallel(const at::Tensor& x, const ProcessGroup& group) {
  return CopyToParallel::apply(x, c10::make_intrusive<GroupCapsule>(group));
}

at::Tensor tp_reduce_from_parallel(const at::Tensor& x, const ProcessGroup& group) {
  return ReduceFromParallel::apply(x, c10::make_intrusive<GroupCapsule>(group));
}

at::Tensor tp_gather_last_dim(const at::Tensor& x, int64_t extent, const ProcessGroup& group) {
  return GatherLastDim::apply(x, c10::make_intrusive<GroupCapsule>(group, extent));
}

at::Tensor tp_split_last_dim(const at::Tensor& x, const ProcessGroup& group) {
  if (x.dim() == 0) throw Error("tensor parallel: cannot shard the last dim of a 0-dim input");
  return SplitLastDim::apply(x, c10::make_intrusive<GroupCapsule>(group));
}

}  // namespace fsdpp::detail

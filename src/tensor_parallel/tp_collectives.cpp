#include "tensor_parallel/tp_collectives.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "tensor/local_shard.h"

namespace fsdpp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What backward needs (AutogradContext's saved data holds IValues, so a capsule).
struct Redistribution : torch::CustomClassHolder {
  Redistribution(ProcessGroup g, int64_t d = 0, TPGrad gr = TPGrad::Replicated) : group(std::move(g)), dim(d), grad(gr) {}
  ProcessGroup group;
  int64_t dim;
  TPGrad grad;
  std::vector<int64_t> sizes;  // each rank's part of `dim`
};

c10::intrusive_ptr<Redistribution> saved(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<Redistribution>(ctx->saved_data["r"].toCapsule());
}
void save(AutogradContext* ctx, c10::intrusive_ptr<Redistribution> r) {
  ctx->saved_data["r"] = c10::IValue::make_capsule(std::move(r));
}

// torch.chunk's parts of `extent` slices over `n` ranks.
std::vector<int64_t> chunk_sizes(int64_t extent, int n) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < n; ++r) sizes.push_back(local_shard_size_and_offset(extent, n, r).size);
  return sizes;
}

std::string str(const std::vector<int64_t>& v) { return c10::str(c10::IntArrayRef(v)); }

at::Tensor all_reduced(const at::Tensor& x, const ProcessGroup& group) {
  at::Tensor out = x.contiguous().clone();
  if (group.size() > 1) all_reduce(out, ReduceOp::SUM, group);
  return out;
}

// The ranks' parts of `dim` (sizes[r] on rank r), gathered along it.
at::Tensor all_gathered(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes, const ProcessGroup& group) {
  const int n = group.size();
  if (n == 1) return x.contiguous().clone();
  const int64_t chunk = *std::max_element(sizes.begin(), sizes.end());
  const at::Tensor front = x.movedim(dim, 0);
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = chunk;
  at::Tensor padded = at::zeros(shape, x.options());
  padded.narrow(0, 0, front.size(0)).copy_(front);
  shape[0] = chunk * n;
  at::Tensor all = at::empty(shape, x.options());
  if (all.numel() > 0) all_gather_into_tensor(all, padded, group);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < n; ++r) parts.push_back(all.narrow(0, r * chunk, sizes[r]));
  return at::cat(parts, 0).movedim(0, dim).contiguous();
}

// The sum over ranks of `x`, each rank keeping its torch.chunk part of `dim`.
at::Tensor reduce_scattered(const at::Tensor& x, int64_t dim, const ProcessGroup& group) {
  const int n = group.size(), rank = group.rank();
  if (n == 1) return x.contiguous().clone();
  const int64_t extent = x.size(dim), chunk = local_shard_size_and_offset(extent, n, 0).padded;
  const at::Tensor front = x.movedim(dim, 0);
  std::vector<int64_t> shape = front.sizes().vec();
  shape[0] = chunk * n;
  at::Tensor input = at::zeros(shape, x.options());
  for (int r = 0; r < n; ++r) {
    const LocalShard part = local_shard_size_and_offset(extent, n, r);
    input.narrow(0, r * chunk, part.size).copy_(front.narrow(0, part.offset, part.size));
  }
  shape[0] = chunk;
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() > 0) reduce_scatter_tensor(out, input, ReduceOp::SUM, group);
  return out.narrow(0, 0, local_shard_size_and_offset(extent, n, rank).size).movedim(0, dim).contiguous();
}

at::Tensor own_part(const at::Tensor& x, int64_t dim, const ProcessGroup& group) {
  const LocalShard part = local_shard_size_and_offset(x.size(dim), group.size(), group.rank());
  return x.narrow(dim, part.offset, part.size).contiguous().clone();
}

// Every rank's part of `dim`: torch.chunk's parts of `extent`, or, when unknown (-1), the sizes
// the ranks hold (all-gathered), checked against torch.chunk's parts of their sum.
std::vector<int64_t> part_sizes(const at::Tensor& x, int64_t dim, int64_t extent, const ProcessGroup& group,
                                const std::string& who) {
  const int n = group.size(), rank = group.rank();
  if (extent >= 0) {
    std::vector<int64_t> sizes = chunk_sizes(extent, n);
    if (x.size(dim) != sizes[rank])
      throw Error(who + ": its input " + c10::str(x.sizes()) + " on TP rank " + std::to_string(rank) + " of " +
                  std::to_string(n) + " should hold " + std::to_string(sizes[rank]) + " of " + std::to_string(extent) +
                  " slices of dim " + std::to_string(dim));
    return sizes;
  }
  std::vector<int64_t> sizes(n, x.size(dim));
  if (n > 1) {
    at::Tensor mine = at::full({1}, x.size(dim), at::kLong);
    at::Tensor all = at::empty({n}, at::kLong);
    all_gather_into_tensor(all, mine, group);
    for (int r = 0; r < n; ++r) sizes[r] = all[r].item<int64_t>();
  }
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (sizes != chunk_sizes(total, n))
    throw Error(who + ": the TP ranks hold " + str(sizes) + " slices of dim " + std::to_string(dim) + " (rank " +
                std::to_string(rank) + "'s input " + c10::str(x.sizes()) + "), not torch.chunk's parts of " +
                std::to_string(total) + " over " + std::to_string(n) + " ranks " + str(chunk_sizes(total, n)));
  return sizes;
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Redistribution> r) {
    save(ctx, std::move(r));
    return x.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved(ctx)->group), at::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, c10::intrusive_ptr<Redistribution> r) {
    return all_reduced(x, r->group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct Gather : torch::autograd::Function<Gather> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Redistribution> r) {
    at::Tensor out = all_gathered(x, r->dim, r->sizes, r->group);
    save(ctx, std::move(r));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = saved(ctx);
    const at::Tensor g = r->grad == TPGrad::Partial ? reduce_scattered(grads[0], r->dim, r->group)
                                                    : own_part(grads[0], r->dim, r->group);
    return {g, at::Tensor()};
  }
};

struct Split : torch::autograd::Function<Split> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Redistribution> r) {
    at::Tensor out = own_part(x, r->dim, r->group);
    r->sizes = chunk_sizes(x.size(r->dim), r->group.size());
    save(ctx, std::move(r));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = saved(ctx);
    return {all_gathered(grads[0], r->dim, r->sizes, r->group), at::Tensor()};
  }
};

struct ReduceScatter : torch::autograd::Function<ReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::intrusive_ptr<Redistribution> r) {
    at::Tensor out = reduce_scattered(x, r->dim, r->group);
    r->sizes = chunk_sizes(x.size(r->dim), r->group.size());
    save(ctx, std::move(r));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto r = saved(ctx);
    return {all_gathered(grads[0], r->dim, r->sizes, r->group), at::Tensor()};
  }
};

}  // namespace

int64_t tp_normalize_dim(int64_t dim, int64_t ndim, const std::string& who) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    throw Error(who + ": dim " + std::to_string(dim) + " is out of range for a " + std::to_string(ndim) + "-dim input");
  return d;
}

at::Tensor tp_copy_to_parallel(const at::Tensor& x, const ProcessGroup& group) {
  return CopyToParallel::apply(x, c10::make_intrusive<Redistribution>(group));
}

at::Tensor tp_reduce_from_parallel(const at::Tensor& x, const ProcessGroup& group) {
  return ReduceFromParallel::apply(x, c10::make_intrusive<Redistribution>(group));
}

at::Tensor tp_gather(const at::Tensor& x, int64_t dim, int64_t extent, TPGrad grad, const ProcessGroup& group,
                     const std::string& who) {
  const int64_t d = tp_normalize_dim(dim, x.dim(), who);
  auto r = c10::make_intrusive<Redistribution>(group, d, grad);
  r->sizes = part_sizes(x, d, extent, group, who);
  return Gather::apply(x, std::move(r));
}

at::Tensor tp_split(const at::Tensor& x, int64_t dim, const ProcessGroup& group) {
  return Split::apply(x, c10::make_intrusive<Redistribution>(group, dim));
}

at::Tensor tp_reduce_scatter(const at::Tensor& x, int64_t dim, const ProcessGroup& group) {
  return ReduceScatter::apply(x, c10::make_intrusive<Redistribution>(group, dim));
}

}  // namespace fsdpp::detail

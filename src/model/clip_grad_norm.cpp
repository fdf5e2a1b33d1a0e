// fsdpp::clip_grad_norm_: the total gradient norm over all ranks' shards, each element counted
// once, and every rank's gradients scaled by PyTorch's clip coefficient.
//
// Each rank sums |g|^p over the gradients it holds, separately for each FSDP unit shard group
// (keyed by its global ranks) and for the parameters no unit shards. A shard group's sum is
// all-reduced over that group only: its ranks hold disjoint, unpadded rows (padding is not in a
// parameter's shard), and the replicas of HSDP / NO_SHARD hold equal gradients after the
// replicate all-reduce, so reducing over the shard group counts every element once (FSDP1
// reduces over its process group, the shard group, the same way). Parameters no unit shards
// (ignored, DDP, plain) are replicated: this rank's gradient counts once, without communication
// (FSDP1's "nonsharded" parameters). Tensor-parallel parts are summed over the ranks that
// partition them. Which group each gradient's parts lie over is ModelLayout's (its entries'
// layouts), the same view the state dicts read.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>

#include <fsdpp/clip_grad_norm.h>
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/model_layout.h>

#include "common/error_text.h"

namespace fsdpp {

namespace {

struct ParamRef {
  std::string name;
  at::Tensor param;
  const TensorLayout* layout;  // the group its gradient's parts lie over; null: whole here
};

// The parameters under their plain keys, each tensor once (tied parameters are registered under
// several keys: the first counts).
std::vector<ParamRef> unique_parameters(const ModelLayout& layout) {
  std::vector<ParamRef> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& e : layout.entries)
    if (!e.is_buffer && seen.insert(e.tensor.unsafeGetTensorImpl()).second)
      out.push_back({e.key, e.tensor, e.layout ? &*e.layout : nullptr});
  return out;
}

// This rank's part of the norm of `grads`: sum of |g|^p, or max |g| for p = inf.
class NormAccumulator {
 public:
  NormAccumulator(double p, at::ScalarType dtype, at::Device device)
      : p_(p), value_(at::zeros({}, at::TensorOptions().dtype(dtype).device(device))) {}

  void add(const at::Tensor& grad) {
    if (grad.numel() == 0) return;  // a rank may hold no rows of a parameter
    at::Tensor g = grad.detach().to(value_.scalar_type());
    at::Tensor part;
    if (std::isinf(p_))
      part = g.abs().max();
    else if (p_ == 1.0)
      part = g.abs().sum();
    else if (p_ == 2.0)
      part = g.square().sum();
    else
      part = g.abs().pow(p_).sum();
    part = part.to(value_.device());
    value_ = std::isinf(p_) ? at::maximum(value_, part) : value_ + part;
  }

  const at::Tensor& value() const { return value_; }

 private:
  double p_;
  at::Tensor value_;
};

std::string format_norm_type(double p) {
  if (std::isinf(p)) return "inf";
  std::ostringstream out;
  out << p;
  return out.str();
}

// PyTorch's argument checks.
void check_arguments(double max_norm, double norm_type) {
  if (std::isnan(norm_type) || norm_type <= 0)  // -inf too
    throw Error("clip_grad_norm_: norm_type must be positive or infinity, got " + format_norm_type(norm_type));
  if (std::isnan(max_norm))
    throw Error("clip_grad_norm_: max_norm is NaN");
}

ModelLayout layout_of(torch::nn::Module& module) {
  try {
    return ModelLayout(module);
  } catch (const Error& e) {
    throw Error("clip_grad_norm_: " + detail::without_prefix(e.what()));
  }
}

// The accumulation dtype: float32 at least (as FSDP1's _get_grad_norm), float64 if any
// parameter is float64. Decided from the parameters, not the gradients, so that every rank
// agrees whichever gradients it holds.
at::ScalarType norm_dtype(const std::vector<ParamRef>& params) {
  at::ScalarType dtype = at::kFloat;
  for (const auto& p : params)
    if (at::isFloatingType(p.param.scalar_type())) dtype = c10::promoteTypes(dtype, p.param.scalar_type());
  return dtype;
}

// This rank's parts of the norm: one per group a partitioned gradient's parts lie over (its
// layout's): a unit's shard group; a tensor-parallel Shard's TP group; both (2-D FSDP x TP): the
// group of the dp x tp mesh's ranks (under HSDP, of one replica's shard x tp ranks, as 1-D HSDP
// sums over the shard group only); and one of the gradients held whole (a TP Replicate gradient
// is the same on its TP ranks, as any replicated one). With the gradients, to scale.
struct LocalParts {
  std::map<std::vector<int>, ProcessGroup> groups;  // by global ranks: one order on every rank
  std::map<std::vector<int>, NormAccumulator> sharded;
  NormAccumulator whole;
  std::vector<at::Tensor> grads;
};

LocalParts local_parts(const std::vector<ParamRef>& params, double norm_type) {
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().param.device();
  const at::ScalarType dtype = norm_dtype(params);
  LocalParts parts{{}, {}, NormAccumulator(norm_type, dtype, device), {}};
  for (const auto& p : params)
    if (p.layout) parts.groups.emplace(p.layout->process_group().ranks(), p.layout->process_group());
  for (const auto& [ranks, group] : parts.groups) parts.sharded.emplace(ranks, NormAccumulator(norm_type, dtype, device));
  for (const auto& p : params) {
    const at::Tensor& grad = p.param.grad();
    if (!grad.defined()) continue;
    parts.grads.push_back(grad);
    (p.layout ? parts.sharded.at(p.layout->process_group().ranks()) : parts.whole).add(grad);
  }
  return parts;
}

// The total norm: each shard group's part reduced over the group, in the same (sorted) order on
// every rank: a rank in several groups joins them in increasing order, so no two ranks wait on
// each other in opposite orders. Gloo's MAX may drop a NaN, so inf-norm sends a NaN flag beside.
at::Tensor total_norm(const LocalParts& parts, double norm_type) {
  const bool inf_norm = std::isinf(norm_type);
  at::Tensor total = parts.whole.value();
  for (const auto& [ranks, part] : parts.sharded) {
    at::Tensor value = part.value();
    const ProcessGroup& group = parts.groups.at(ranks);
    if (group.size() > 1) {
      if (inf_norm) {
        at::Tensor packed = at::stack({value.masked_fill(value.isnan(), 0.0), value.isnan().to(value.scalar_type())}).contiguous();
        all_reduce(packed, ReduceOp::MAX, group);
        value = packed[1].item<double>() > 0 ? at::full({}, std::numeric_limits<double>::quiet_NaN(), packed.options())
                                             : packed[0].clone();
      } else {
        value = value.clone().contiguous();
        all_reduce(value, ReduceOp::SUM, group);
      }
    }
    total = inf_norm ? at::maximum(total, value) : total + value;
  }
  return inf_norm ? total : total.pow(1.0 / norm_type);
}

// error_if_nonfinite's error, naming this rank's non-finite gradients.
void check_finite(const at::Tensor& total, const std::vector<ParamRef>& params, double norm_type) {
  const double t = total.item<double>();
  if (std::isfinite(t)) return;
  std::string which;
  for (const auto& p : params) {
    const at::Tensor& grad = p.param.grad();
    if (grad.defined() && grad.numel() > 0 && !at::isfinite(grad).all().item<bool>())
      which += (which.empty() ? "" : ", ") + ("'" + p.name + "'");
  }
  std::ostringstream msg;
  msg << "clip_grad_norm_: the total norm of order " << format_norm_type(norm_type)
      << " of the gradients is non-finite (" << (std::isnan(t) ? "nan" : "inf") << "), so it cannot be clipped ("
      << (which.empty() ? std::string("no gradient on this rank is non-finite: it is in another rank's shard")
                        : "non-finite gradient on this rank: " + which)
      << "). Set error_if_nonfinite = false to scale the gradients by it anyway";
  throw Error(msg.str());
}

}  // namespace

at::Tensor clip_grad_norm_(torch::nn::Module& module, double max_norm, double norm_type, bool error_if_nonfinite) {
  check_arguments(max_norm, norm_type);
  const ModelLayout layout = layout_of(module);  // `params` point into it
  const std::vector<ParamRef> params = unique_parameters(layout);
  const LocalParts parts = local_parts(params, norm_type);
  const at::Tensor total = total_norm(parts, norm_type);
  if (error_if_nonfinite) check_finite(total, params, norm_type);

  // An infinite max_norm measures only: PyTorch's coefficient would be inf / inf = nan for an
  // infinite norm, and 1 otherwise.
  if (std::isinf(max_norm) && max_norm > 0) return total;
  // PyTorch's coefficient, in the norm's dtype: max_norm / (total + 1e-6), at most 1.
  const at::Tensor clip_coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  at::NoGradGuard no_grad;
  for (const auto& grad : parts.grads) grad.mul_(clip_coef.to(grad.device()));
  return total;
}

}  // namespace fsdpp

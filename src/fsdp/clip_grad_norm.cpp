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
// partition them (below). Only the public APIs are used: sharded_parameters() and
// process_group() of each unit, tensor_parallel_parameters().
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
#include <fsdpp/fully_shard.h>
#include <fsdpp/tensor_parallel.h>

#include "comm/flattened_mesh.h"
#include "common/error_text.h"
#include "common/shape_string.h"

namespace fsdpp {

namespace {

struct ParamRef {
  std::string name;
  at::Tensor param;
};

// Parameters under their names without wrapper segments, each tensor once (tied parameters are
// registered under several names).
std::vector<ParamRef> unique_parameters(const torch::nn::Module& module) {
  std::vector<ParamRef> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    std::string name = item.key();
    for (const std::string segment : {"_fsdp_wrapped_module.", "_checkpoint_wrapped_module."})
      for (size_t pos; (pos = name.find(segment)) != std::string::npos;) name.erase(pos, segment.size());
    out.push_back({std::move(name), item.value()});
  }
  return out;
}

std::vector<FSDPModule*> units_of(torch::nn::Module& module) {
  std::vector<FSDPModule*> units;
  if (auto* self = dynamic_cast<FSDPModule*>(&module)) units.push_back(self);
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get())) units.push_back(unit);
  return units;
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

}  // namespace

at::Tensor clip_grad_norm_(torch::nn::Module& module, double max_norm, double norm_type, bool error_if_nonfinite) {
  const bool inf_norm = std::isinf(norm_type);
  if (std::isnan(norm_type) || norm_type <= 0)  // -inf too
    throw Error("clip_grad_norm_: norm_type must be positive or infinity, got " + format_norm_type(norm_type));
  if (std::isnan(max_norm))
    throw Error("clip_grad_norm_: max_norm is NaN");

  const std::vector<ParamRef> params = unique_parameters(module);
  // The accumulation dtype: float32 at least (as FSDP1's _get_grad_norm), float64 if any
  // parameter is float64. Decided from the parameters, not the gradients, so that every rank
  // agrees whichever gradients it holds.
  at::ScalarType dtype = at::kFloat;
  for (const auto& p : params)
    if (at::isFloatingType(p.param.scalar_type())) dtype = c10::promoteTypes(dtype, p.param.scalar_type());
  const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().param.device();

  // The group over which each partitioned gradient's parts lie: a unit's shard group; a
  // tensor-parallel Shard's TP group; both (2-D FSDP x TP): the group of the dp x tp mesh's ranks
  // (under HSDP, of one replica's shard x tp ranks, as 1-D HSDP sums over the shard group only).
  // A TP Replicate gradient is the same on its TP ranks, as any replicated one.
  std::map<std::vector<int>, ProcessGroup> groups;                    // by global ranks: one order on every rank
  std::map<const c10::TensorImpl*, const std::vector<int>*> group_of;  // parameter -> its group's key
  std::map<const c10::TensorImpl*, ProcessGroup> tp_group_of;         // TP Shard parameters
  for (const auto& p : tensor_parallel_parameters(module))
    if (p.layout.placements().front().is_shard()) tp_group_of[p.param.unsafeGetTensorImpl()] = p.layout.process_group();
  auto join = [&](const at::Tensor& param, const ProcessGroup& group) {
    group_of[param.unsafeGetTensorImpl()] = &groups.emplace(group.ranks(), group).first->first;
  };
  for (FSDPModule* unit : units_of(module)) {
    const ProcessGroup& group = unit->process_group();
    for (const auto& sp : unit->sharded_parameters()) {
      auto tp = tp_group_of.find(sp.param.unsafeGetTensorImpl());
      if (tp == tp_group_of.end()) {
        join(sp.param, group);
        continue;
      }
      // Its blocks tile the parameter over the (dp, tp) mesh: the norm's part sums over the
      // mesh's group (made by its members alone, so pipeline stages and HSDP replicas apart).
      std::shared_ptr<const detail::FlattenedMesh> mesh;
      try {
        mesh = detail::flattened_mesh(group, tp->second);
      } catch (const Error& e) {
        throw Error("clip_grad_norm_: a 2-D parameter (" + detail::shape_string(sp.layout.global_shape()) +
                    " TP part) is sharded over " + group.name() + " and " + tp->second.name() + ": " +
                    detail::without_prefix(e.what()));
      }
      join(sp.param, mesh->group);
      tp_group_of.erase(tp);
    }
  }
  for (const auto& [impl, tp] : tp_group_of) group_of[impl] = &groups.emplace(tp.ranks(), tp).first->first;

  std::map<std::vector<int>, NormAccumulator> sharded_parts;
  for (const auto& [ranks, group] : groups) sharded_parts.emplace(ranks, NormAccumulator(norm_type, dtype, device));
  NormAccumulator local_part(norm_type, dtype, device);
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    const at::Tensor& grad = p.param.grad();
    if (!grad.defined()) continue;
    grads.push_back(grad);
    auto it = group_of.find(p.param.unsafeGetTensorImpl());
    (it == group_of.end() ? local_part : sharded_parts.at(*it->second)).add(grad);
  }

  // Reduce each shard group's part over the group, in the same (sorted) order on every rank:
  // a rank in several groups joins them in increasing order, so no two ranks wait on each
  // other in opposite orders. Gloo's MAX may drop a NaN, so inf-norm sends a NaN flag beside.
  at::Tensor total = local_part.value();
  for (auto& [ranks, part] : sharded_parts) {
    at::Tensor value = part.value();
    const ProcessGroup& group = groups.at(ranks);
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
  if (!inf_norm) total = total.pow(1.0 / norm_type);

  if (error_if_nonfinite) {
    const double t = total.item<double>();
    if (!std::isfinite(t)) {
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
  }

  // PyTorch's coefficient, in the norm's dtype: max_norm / (total + 1e-6), at most 1.
  const at::Tensor clip_coef = at::clamp_max(max_norm / (total + 1e-6), 1.0);
  {
    at::NoGradGuard no_grad;
    for (auto& grad : grads) grad.mul_(clip_coef.to(grad.device()));
  }
  return total;
}

}  // namespace fsdpp

#include "state_dict/fsdp_layout.h"


#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/collectives.h>
#include <fsdpp/error.h>

#include "common/shape_string.h"

namespace fsdpp::detail {

namespace {

constexpr const char* kWrapped = "_fsdp_wrapped_module";

struct Owner {
  const FSDPParam* param;
  FSDPModule* unit;
};

void visit_module(torch::nn::Module& m, const std::string& prefix,
           const std::unordered_map<const c10::TensorImpl*, Owner>& owners, ModelLayout& out) {
  if (auto* unit = dynamic_cast<FSDPModule*>(&m))
    if (unit->fsdp_state() && unit->fsdp_state()->param_group())
      out.units.push_back({prefix + "_flat_param", unit, out.entries.size()});
  for (const auto& item : m.named_parameters(/*recurse=*/false)) {
    ModelEntry e{prefix + item.key(), item.value(), false, nullptr, nullptr};
    auto it = owners.find(item.value().unsafeGetTensorImpl());
    if (it != owners.end()) {
      e.fsdp_param = it->second.param;
      e.unit = it->second.unit;
    }
    out.entries.push_back(std::move(e));
  }
  for (const auto& item : m.named_buffers(/*recurse=*/false))
    out.entries.push_back({prefix + item.key(), item.value(), true, nullptr, nullptr});
  for (const auto& child : m.named_children())
    visit_module(*child.value(), child.key() == kWrapped ? prefix : prefix + child.key() + ".", owners, out);
}

}  // namespace

ModelLayout collect_layout(torch::nn::Module& model) {
  std::unordered_map<const c10::TensorImpl*, Owner> owners;
  for (const auto& m : model.modules(/*include_self=*/true))
    if (auto* unit = dynamic_cast<FSDPModule*>(m.get()))
      if (unit->fsdp_state() && unit->fsdp_state()->param_group())
        for (const auto& p : unit->fsdp_state()->param_group()->fsdp_params())
          owners.emplace(p.param().unsafeGetTensorImpl(), Owner{&p, unit});
  ModelLayout layout;
  visit_module(model, "", owners, layout);
  return layout;
}

std::vector<int64_t> sharded_size_of(const FSDPParam& p, int rank) {
  if (p.unsharded_size().empty()) return {p.rows_of(rank)};
  std::vector<int64_t> s = p.unsharded_size();
  s[0] = p.rows_of(rank);
  return s;
}

at::Tensor rows_of_full(const FSDPParam& p, const at::Tensor& full, int rank, int world_size) {
  const int64_t rows = p.rows_of(rank);
  const int64_t start = std::min(p.row_offset(rank), p.dim0());
  return full.reshape({p.dim0(), p.row_numel()}).narrow(0, start, rows).reshape(sharded_size_of(p, rank));
}

std::vector<ShardMetadata> row_shards(const FSDPParam& p, int world_size) {
  std::vector<ShardMetadata> out;
  const auto& full = p.unsharded_size();
  for (int r = 0; r < world_size; ++r) {
    const int64_t rows = p.rows_of(r);
    if (rows == 0) continue;
    ShardMetadata m;
    m.placement = r;
    if (!full.empty()) {  // a 0-dim parameter: one shard of size [] on rank 0
      m.shard_offsets.assign(full.size(), 0);
      m.shard_offsets[0] = p.row_offset(r);
      m.shard_sizes = full;
      m.shard_sizes[0] = rows;
    }
    out.push_back(std::move(m));
  }
  return out;
}

ShardedTensor to_sharded(const FSDPParam& p, const at::Tensor& local, const ProcessGroup& group, bool copy) {
  const int rank = group.rank(), n = group.size();
  auto all = row_shards(p, n);
  std::vector<Shard> mine;
  for (const auto& m : all) {
    if (m.placement != rank) continue;
    at::Tensor t = local.detach().reshape(m.shard_sizes);
    mine.push_back({copy ? t.clone() : t, m});
  }
  return ShardedTensor::from_local_shards_and_global_metadata(std::move(mine), p.unsharded_size(), local.scalar_type(),
                                                              std::move(all), group);
}

bool matches_row_layout(const ShardedTensor& st, const std::vector<ShardMetadata>& expected, int world_size) {
  if (static_cast<int>(st.process_group().size()) != world_size) return false;
  if (st.shards_metadata().size() != expected.size()) return false;
  for (const auto& m : expected) {
    bool found = false;
    for (const auto& s : st.shards_metadata()) found = found || s == m;
    if (!found) return false;
  }
  return true;
}

at::Tensor local_shard_with(const ShardedTensor& st, const ShardMetadata& m) {
  for (const auto& s : st.local_shards())
    if (s.metadata == m) return s.tensor;
  throw Error("ShardedTensor: no local shard at offsets " + shape_string(m.shard_offsets) + " of size " +
              shape_string(m.shard_sizes) + " on this rank");
}

at::Tensor local_rows_from(const ShardedTensor& st, const FSDPParam& p, const ProcessGroup& group) {
  const int rank = group.rank(), n = group.size();
  auto expected = row_shards(p, n);
  if (matches_row_layout(st, expected, n)) {
    for (const auto& m : expected)
      if (m.placement == rank) return local_shard_with(st, m).reshape(sharded_size_of(p, rank));
    return at::empty(sharded_size_of(p, rank), at::TensorOptions().dtype(st.dtype()));
  }
  if (!st.process_group().is_member())
    throw Error("a ShardedTensor sharded differently from the model needs redistributing, but this rank is not a member "
                "of its process group " + st.process_group().name());
  return rows_of_full(p, st.full_tensor(), rank, n);
}

std::unordered_map<const FSDPParam*, at::Tensor> gather_full_params(const ModelLayout& layout) {
  at::NoGradGuard no_grad;
  std::unordered_map<const FSDPParam*, at::Tensor> out;
  for (const auto& u : layout.units) {
    const FSDPParamGroup& g = u.group();
    const ProcessGroup& group = g.process_group();
    const int n = group.size();
    std::vector<at::Tensor> chunks;
    for (const auto& p : g.fsdp_params()) chunks.push_back(p.padded_chunk());
    at::Tensor flat = at::cat(chunks);
    at::Tensor gathered = flat;
    if (n > 1) {
      gathered = at::empty({n * flat.numel()}, flat.options());
      all_gather_into_tensor(gathered, flat, group);
    }
    // Rank r's padded chunk of parameter i sits at [r * S + offset_i, ...): rows r * chunk_rows on.
    at::Tensor by_rank = gathered.view({n, flat.numel()});
    int64_t offset = 0;
    for (const auto& p : g.fsdp_params()) {
      const int64_t c = p.padded_chunk_numel();
      at::Tensor rows = by_rank.narrow(1, offset, c).reshape({n * p.chunk_rows(), p.row_numel()});
      out[&p] = rows.narrow(0, 0, p.dim0()).reshape(p.unsharded_size()).clone();
      offset += c;
    }
  }
  return out;
}

}  // namespace fsdpp::detail

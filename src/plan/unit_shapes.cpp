#include "plan/unit_shapes.h"

#include <fsdpp/error.h>

#include "tensor/local_shard.h"

namespace fsdpp::plan::detail {
namespace {

int64_t kv_heads_of(const ModelShape& m) { return m.kv_heads() > 0 ? m.kv_heads() : m.heads(); }
int64_t ffn_of(const ModelShape& m) { return m.ffn_hidden() > 0 ? m.ffn_hidden() : 4 * m.dim(); }

}  // namespace

std::vector<std::vector<ParamShape>> unit_params(const ModelShape& m, int64_t tp) {
  const int64_t d = m.dim(), hd = d / m.heads(), q = m.heads() / tp * hd, kv = kv_heads_of(m) / tp * hd,
                f = ffn_of(m) / tp, v = m.vocab() / tp;
  const bool example = m.architecture() == Architecture::kExampleTransformer;
  std::vector<std::vector<ParamShape>> units;
  std::vector<ParamShape> root{{"tok_embeddings.weight", v, d}};
  if (example) root.push_back({"pos_embeddings.weight", m.seq(), d});
  root.push_back({"norm.weight", d, 1});
  if (example) root.push_back({"norm.bias", d, 1});
  if (!m.tied_embeddings()) root.push_back({"output.weight", v, d});
  units.push_back(root);
  for (int64_t i = 0; i < m.layers(); ++i) {
    std::vector<ParamShape> block{{"attention_norm.weight", d, 1}};
    if (example) block.push_back({"attention_norm.bias", d, 1});
    block.push_back({"attention.wq.weight", q, d});
    block.push_back({"attention.wk.weight", kv, d});
    block.push_back({"attention.wv.weight", kv, d});
    block.push_back({"attention.wo.weight", d, q});
    block.push_back({"ffn_norm.weight", d, 1});
    if (example) {
      block.push_back({"ffn_norm.bias", d, 1});
      block.push_back({"feed_forward.w1.weight", f, d});
      block.push_back({"feed_forward.w1.bias", f, 1});
      block.push_back({"feed_forward.w2.weight", d, f});
      block.push_back({"feed_forward.w2.bias", d, 1});
    } else {
      block.push_back({"feed_forward.w1.weight", f, d});
      block.push_back({"feed_forward.w3.weight", f, d});
      block.push_back({"feed_forward.w2.weight", d, f});
    }
    units.push_back(block);
  }
  return units;
}

UnitPlan shard_unit(const std::string& name, const std::vector<ParamShape>& params, int64_t n, int64_t rank) {
  UnitPlan u;
  u.name = name;
  for (const auto& p : params) {
    const auto part = fsdpp::detail::local_shard_size_and_offset(p.dim0, n, rank);
    u.numel += p.numel();
    u.shard_padded_numel += part.padded * p.row_numel;
    u.local_numel += part.size * p.row_numel;
  }
  u.unsharded_padded_numel = u.shard_padded_numel * n;
  return u;
}

namespace {
void require(bool ok, const std::string& what) {
  if (!ok) throw Error("plan: " + what);
}
}  // namespace

void check_layout(const ParallelLayout& l) {
  const int64_t tp = l.tensor_parallel(), r = l.replicate(), n = l.world_size();
  require(tp > 0 && r > 0 && n > 0, "world_size, replicate and tensor_parallel must be positive");
  require(n % (tp * r) == 0, "replicate x tensor_parallel (" + std::to_string(r) + " x " + std::to_string(tp) +
                                 ") must divide world_size " + std::to_string(n));
  require(l.rank() >= 0 && l.rank() < n / (tp * r),
          "rank " + std::to_string(l.rank()) + " is outside the shard group of " + std::to_string(n / (tp * r)));
}

void check_shape_and_layout(const ModelShape& m, const ParallelLayout& l) {
  require(m.layers() >= 0 && m.dim() > 0 && m.heads() > 0 && m.vocab() > 0 && m.seq() > 0 && m.batch() > 0,
          "layers, dim, heads, vocab, seq and batch must be positive (layers " + std::to_string(m.layers()) + ", dim " +
              std::to_string(m.dim()) + ", heads " + std::to_string(m.heads()) + ")");
  require(m.dim() % m.heads() == 0, "heads " + std::to_string(m.heads()) + " must divide dim " + std::to_string(m.dim()));
  require(m.heads() % kv_heads_of(m) == 0,
          "kv_heads " + std::to_string(kv_heads_of(m)) + " must divide heads " + std::to_string(m.heads()));
  require(m.architecture() != Architecture::kExampleTransformer || kv_heads_of(m) == m.heads(),
          "examples/transformer.h has no grouped-query attention: kv_heads " + std::to_string(kv_heads_of(m)) +
              " must equal heads " + std::to_string(m.heads()));
  check_layout(l);
  const int64_t tp = l.tensor_parallel();
  require(kv_heads_of(m) % tp == 0 && ffn_of(m) % tp == 0 && m.vocab() % tp == 0,
          "tensor_parallel " + std::to_string(tp) + " must divide kv_heads " + std::to_string(kv_heads_of(m)) +
              ", the ffn hidden size " + std::to_string(ffn_of(m)) + " and vocab " + std::to_string(m.vocab()));
  require(!(m.tied_embeddings() && tp > 1), "tied embeddings with tensor_parallel > 1 are not modelled");
}

}  // namespace fsdpp::plan::detail

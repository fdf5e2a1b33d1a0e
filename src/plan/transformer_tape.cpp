#include "plan/transformer_tape.h"

namespace fsdpp::plan::detail {
namespace {

constexpr int64_t kFloat = 4, kLong = 8;

struct Dims {
  int64_t b, s, t, d, hd, hq, hk, f, v, a;
  int64_t td() const { return t * d * a; }
  int64_t tq() const { return t * hq * hd * a; }
  int64_t tk() const { return t * hk * hd * a; }
  int64_t tf() const { return t * f * a; }
  int64_t scores() const { return b * hq * s * s * a; }
};

// Explicit attention as examples/transformer.h runs it: matmul of the transposed heads copies
// them contiguous (saved by bmm), the scaled and masked scores are temporaries, softmax saves its
// output, the causal mask (bool, s x s) is saved by masked_fill. Returns the heads' output (the
// bmm result, shaped b, h, s, hd); `locals` collects what Attention::forward keeps until it returns.
int explicit_attention(Tape& tape, const Dims& x, int q, int k, int v, std::vector<int>& locals) {
  const int qc = tape.op("q heads contiguous", x.tq(), {q});
  const int kc = tape.op("k^T heads contiguous", x.tq(), {k});
  const int raw = tape.op("q @ k^T", x.scores(), {qc, kc}, {qc, kc});
  const int scaled = tape.op("/ sqrt(head_dim)", x.scores(), {raw});
  const int mask = tape.op("causal mask", x.s * x.s, {});
  tape.no_grad(mask);
  tape.last_op_forward_temp(x.s * x.s);  // ones() before triu()
  const int masked = tape.op("masked_fill", x.scores(), {scaled, mask}, {mask});
  const int probs = tape.op("softmax", x.scores(), {masked});
  tape.saves_own_output();
  const int vc = tape.op("v heads contiguous", x.tq(), {v});
  const int out = tape.op("probs @ v", x.tq(), {probs, vc}, {probs, vc});
  locals.insert(locals.end(), {masked, out});
  return out;
}

// A flash-style kernel: saves q, k, v, its output and the log-sum-exp (float, b x h x s).
int fused_attention(Tape& tape, const Dims& x, int q, int k, int v) {
  const int out = tape.op("scaled_dot_product_attention", x.tq(), {q, k, v}, {q, k, v});
  tape.saves_own_output();
  tape.last_op_saves_extra(x.b * x.hq * x.s * kFloat);
  return out;
}

int example_block(Tape& tape, const Dims& x, int in, bool explicit_kernel) {
  const int64_t norm_stats = 2 * x.t * kFloat, a = x.a;
  const int n1 = tape.op("attention_norm", x.td(), {in}, {in}, 2 * x.d * a);
  tape.last_op_saves_extra(norm_stats);
  const int q = tape.op("wq", x.tq(), {n1}, {n1}, x.hq * x.hd * x.d * a);
  const int k = tape.op("wk", x.tk(), {n1}, {n1}, x.hk * x.hd * x.d * a);
  const int v = tape.op("wv", x.tk(), {n1}, {n1}, x.hk * x.hd * x.d * a);
  std::vector<int> locals{q, k, v};
  const int heads = explicit_kernel ? explicit_attention(tape, x, q, k, v, locals) : fused_attention(tape, x, q, k, v);
  const int merged = tape.op("heads -> dim contiguous", x.tq(), {heads});
  const int attn = tape.op("wo", x.td(), {merged}, {merged}, x.d * x.hq * x.hd * a);
  for (int t : locals) tape.hold(t, tape.last_op());
  const int h = tape.op("x + attention", x.td(), {in, attn});
  tape.last_op_passes_grad_through();
  // Temporaries of a C++ full expression live until it ends (what matters without grad mode,
  // where nothing is saved: a checkpointed block's forward).
  tape.hold(n1, tape.last_op());
  const int n2 = tape.op("ffn_norm", x.td(), {h}, {h}, 2 * x.d * a);
  tape.last_op_saves_extra(norm_stats);
  const int f1 = tape.op("w1", x.tf(), {n2}, {n2}, (x.f * x.d + x.f) * a);
  const int g = tape.op("gelu", x.tf(), {f1}, {f1});
  const int f2 = tape.op("w2", x.td(), {g}, {g}, (x.d * x.f + x.d) * a);
  tape.hold(f1, tape.last_op());
  tape.hold(g, tape.last_op());
  const int out = tape.op("h + feed_forward", x.td(), {h, f2});
  tape.last_op_passes_grad_through();
  tape.hold(n2, tape.last_op());
  return out;
}

int llama_block(Tape& tape, const Dims& x, int in, bool explicit_kernel) {
  const int64_t rstd = x.t * kFloat, a = x.a;
  const int n1 = tape.op("attention_norm (RMSNorm)", x.td(), {in}, {in}, x.d * a);
  tape.last_op_saves_extra(rstd);
  const int q = tape.op("wq", x.tq(), {n1}, {n1}, x.hq * x.hd * x.d * a);
  const int k = tape.op("wk", x.tk(), {n1}, {n1}, x.hk * x.hd * x.d * a);
  const int v = tape.op("wv", x.tk(), {n1}, {n1}, x.hk * x.hd * x.d * a);
  // Rotary embedding: x * cos + rotate_half(x) * sin (cos and sin are constants: nothing saved).
  const int qr = tape.op("rotary q", x.tq(), {q});
  tape.last_op_forward_temp(2 * x.tq());
  const int kr = tape.op("rotary k", x.tk(), {k});
  tape.last_op_forward_temp(2 * x.tk());
  // Grouped-query attention: k and v repeated to every query head (copies).
  const int kx = tape.op("repeat k heads", x.tq(), {kr});
  const int vx = tape.op("repeat v heads", x.tq(), {v});
  std::vector<int> locals{q, k, v, qr, kr, kx, vx};
  const int heads = explicit_kernel ? explicit_attention(tape, x, qr, kx, vx, locals) : fused_attention(tape, x, qr, kx, vx);
  const int merged = tape.op("heads -> dim contiguous", x.tq(), {heads});
  const int attn = tape.op("wo", x.td(), {merged}, {merged}, x.d * x.hq * x.hd * a);
  for (int t : locals) tape.hold(t, tape.last_op());
  const int h = tape.op("x + attention", x.td(), {in, attn});
  tape.last_op_passes_grad_through();
  tape.hold(n1, tape.last_op());
  const int n2 = tape.op("ffn_norm (RMSNorm)", x.td(), {h}, {h}, x.d * a);
  tape.last_op_saves_extra(rstd);
  const int g1 = tape.op("w1", x.tf(), {n2}, {n2}, x.f * x.d * a);
  const int act = tape.op("silu", x.tf(), {g1}, {g1});
  const int g3 = tape.op("w3", x.tf(), {n2}, {n2}, x.f * x.d * a);
  const int gated = tape.op("silu * w3", x.tf(), {act, g3}, {act, g3});
  const int f2 = tape.op("w2", x.td(), {gated}, {gated}, x.d * x.f * a);
  for (int t : {g1, act, g3, gated}) tape.hold(t, tape.last_op());
  const int out = tape.op("h + feed_forward", x.td(), {h, f2});
  tape.last_op_passes_grad_through();
  tape.hold(n2, tape.last_op());
  return out;
}

}  // namespace

Tape transformer_tape(const ModelShape& m, int64_t tp, int64_t a) {
  const int64_t kv = m.kv_heads() > 0 ? m.kv_heads() : m.heads();
  const int64_t ffn = m.ffn_hidden() > 0 ? m.ffn_hidden() : 4 * m.dim();
  const Dims x{m.batch(), m.seq(), m.batch() * m.seq(), m.dim(), m.dim() / m.heads(), m.heads() / tp, kv / tp, ffn / tp,
               m.vocab() / tp, a};
  const bool example = m.architecture() == Architecture::kExampleTransformer;
  const bool explicit_kernel = m.attention() == AttentionKernel::kExplicit;
  Tape tape;
  tape.set_unit(0);
  // Token ids exist before the step; an embedding saves them (no new bytes).
  int h = tape.op("tok_embeddings", x.td(), {}, {}, x.v * x.d * a);
  if (m.tied_embeddings()) tape.last_op_accumulates_param_grad();  // into the output projection's
  if (example) {
    const int positions = tape.op("positions (arange)", x.s * kLong, {});
    tape.no_grad(positions);
    const int pos = tape.op("pos_embeddings", x.s * x.d * a, {positions}, {positions}, x.s * x.d * a);
    h = tape.op("tok + pos", x.td(), {h, pos});
    tape.last_op_passes_grad_through();
  }
  for (int64_t i = 0; i < m.layers(); ++i) {
    tape.set_unit(static_cast<int>(1 + i));
    h = example ? example_block(tape, x, h, explicit_kernel) : llama_block(tape, x, h, explicit_kernel);
  }
  tape.set_unit(0);
  const int n = tape.op(example ? "norm" : "norm (RMSNorm)", x.td(), {h}, {h}, (example ? 2 : 1) * x.d * a);
  tape.last_op_saves_extra((example ? 2 : 1) * x.t * kFloat);
  const int logits = tape.op("output", x.t * x.v * a, {n}, {n}, x.v * x.d * a);
  tape.set_unit(-1);
  // cross_entropy = log_softmax (saves its output) + nll_loss (saves the targets, which exist
  // already, and total_weight); the logits are a temporary of the caller's full expression.
  const int log_probs = tape.op("log_softmax", x.t * x.v * a, {logits});
  tape.saves_own_output();
  tape.op("nll_loss", kFloat, {log_probs}, {}, 0);
  tape.last_op_saves_extra(kFloat);
  tape.hold(logits, tape.last_op());
  return tape;
}

}  // namespace fsdpp::plan::detail

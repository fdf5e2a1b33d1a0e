// Join: uneven inputs. A joined rank shadows the collectives of the ranks still training.
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/join.h>

namespace fsdpp {
namespace {

struct JoinContext {
  std::vector<Joinable*> joinables;
  ProcessGroup group;
  c10::Device device{c10::kCPU};
  bool throw_on_early_termination = false;
  bool joined = false;
};

thread_local JoinContext* current_context = nullptr;

// One all_reduce per iteration: ranks still training contribute 1, joined ranks 0.
int64_t count_not_joined(const JoinContext& ctx, int64_t mine) {
  at::Tensor t = at::full({1}, mine, at::TensorOptions().dtype(at::kLong).device(ctx.device));
  all_reduce(t, ReduceOp::SUM, ctx.group);
  return t.item<int64_t>();
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, bool enable, bool throw_on_early_termination)
    : joinables_(std::move(joinables)), enable_(enable), throw_on_early_termination_(throw_on_early_termination) {
  if (joinables_.empty()) throw Error("Join: needs at least one joinable");
  for (size_t i = 0; i < joinables_.size(); ++i)
    if (!joinables_[i]) throw Error("Join: joinable " + std::to_string(i) + " is null");
}

void Join::run(const std::function<void()>& body) {
  if (!enable_) {
    body();
    return;
  }
  if (current_context) throw Error("Join: a Join context is already active on this thread (they do not nest)");
  JoinContext ctx;
  ctx.joinables = joinables_;
  ctx.group = joinables_[0]->join_process_group();
  if (!ctx.group.defined()) ctx.group = default_group();
  ctx.device = joinables_[0]->join_device();
  ctx.throw_on_early_termination = throw_on_early_termination_;
  for (size_t i = 1; i < joinables_.size(); ++i) {
    ProcessGroup g = joinables_[i]->join_process_group();
    if (!g.defined()) g = default_group();
    if (g.ranks() != ctx.group.ranks())
      throw Error("Join: joinable " + std::to_string(i) + " uses process group " + g.name() +
                  ", joinable 0 uses " + ctx.group.name() + "; all joinables must share one group");
  }
  std::vector<std::unique_ptr<JoinHook>> hooks;
  for (Joinable* j : joinables_) hooks.push_back(j->join_hook());

  struct Reset {
    ~Reset() { current_context = nullptr; }
  } reset;
  current_context = &ctx;
  body();

  // This rank has joined: shadow the others' iterations until none is left.
  ctx.joined = true;
  bool is_last_joiner = true;
  while (count_not_joined(ctx, 0) > 0) {
    // The ranks still training learn of it from the same all_reduce (notify_join_context).
    if (ctx.throw_on_early_termination)
      throw Error("Join: rank " + std::to_string(ctx.group.global_rank(ctx.group.rank())) +
                  " exhausted its inputs while other ranks of group " + ctx.group.name() +
                  " still train (throw_on_early_termination)");
    for (auto& hook : hooks) hook->main_hook();
    is_last_joiner = false;
  }
  for (auto& hook : hooks) hook->post_hook(is_last_joiner);
}

int64_t Join::notify_join_context(Joinable& joinable) {
  JoinContext* ctx = current_context;
  if (!ctx || ctx->joined || ctx->joinables.front() != &joinable) return 0;
  const int64_t not_joined = count_not_joined(*ctx, 1);
  if (ctx->throw_on_early_termination && not_joined < ctx->group.size())
    throw Error("Join: detected that " + std::to_string(ctx->group.size() - not_joined) + " rank(s) of group " +
                ctx->group.name() + " exhausted their inputs; throwing on every rank (throw_on_early_termination)");
  return not_joined;
}

}  // namespace fsdpp

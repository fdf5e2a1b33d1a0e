// Distributed checkpoint throughput and training stall (issue 6), one run per N under fsdpp-run.
// The model is the FSDP transformer of examples/transformer.h (every block a unit), its
// SHARDED model state dict saved as the checkpoint (no optimizer state). Measured:
//  - sync save (--reps times; the median and range are printed): seconds and MiB/s per rank (bytes of this rank's data file / seconds; save
//    includes the fsync of the data file and, on rank 0, the metadata and the rename) and
//    aggregate (all bytes / the slowest rank's seconds);
//  - load into the same sharding (page cache dropped first when --drop-caches can, then again
//    warm), and optionally from a checkpoint saved at another N (--reshard-from): MiB/s per
//    rank of the bytes its tensors need;
//  - the training stall: the median step time, a sync save (state dict + save) between two
//    steps, and an async save (state dict + the async_save call, then training steps while the
//    background thread writes, until every rank's save is done, then wait()).
// Rank 0 prints the results; lines "RESULT key=value" are for scripts.
//   fsdpp-run --nproc-per-node 2 bench_checkpoint --dir /tmp/ckpt-bench --keep /tmp/ckpt-2
// --export: only checkpoint::export_safetensors of the live model to DIR/model.safetensors
// (issue 14): its seconds and each rank's memory peak above its state (fsdpp's allocator) vs
// the largest tensor, the largest unit and the full model; then exits.
//   fsdpp-run --nproc-per-node 2 bench_checkpoint --dir /tmp/export --export --layers 12 --dim 512
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fsdpp/fsdpp.h>

#include "bench_util.h"
#include "transformer.h"

namespace {

using fsdpp::bench::mib;
using fsdpp::examples::language_model_loss;
using fsdpp::examples::Transformer;
using fsdpp::examples::TransformerArgs;
using fsdpp::examples::TransformerBlockImpl;
namespace ckpt = fsdpp::checkpoint;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Every rank's value, in rank order.
std::vector<double> gather(double v, const fsdpp::ProcessGroup& group) {
  at::Tensor out = torch::empty({group.size()}, torch::kDouble);
  fsdpp::all_gather_into_tensor(out, torch::tensor({v}, torch::kDouble), group);
  return std::vector<double>(out.data_ptr<double>(), out.data_ptr<double>() + group.size());
}
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
double sum_of(const std::vector<double>& v) { return std::accumulate(v.begin(), v.end(), 0.0); }

// Bytes of the tensors (this rank's shards) in a State.
double tensor_bytes(const ckpt::State& state) {
  double bytes = 0;
  for (const auto& [key, e] : state) {
    if (e.kind() == ckpt::Entry::Kind::kTensor) bytes += e.tensor().nbytes();
    if (e.kind() == ckpt::Entry::Kind::kSharded)
      for (const auto& s : e.shards()) bytes += s.tensor.nbytes();
  }
  return bytes;
}

// A State shaped like `like` with fresh tensors full of NaN, to load into.
ckpt::State blank_like(const ckpt::State& like) {
  ckpt::State out;
  for (const auto& [key, e] : like) {
    if (e.kind() == ckpt::Entry::Kind::kTensor) {
      out[key] = torch::full_like(e.tensor(), NAN);
    } else if (e.kind() == ckpt::Entry::Kind::kSharded) {
      std::vector<ckpt::LocalShard> shards;
      for (const auto& s : e.shards()) shards.push_back({torch::full_like(s.tensor, NAN), s.offsets});
      out[key] = ckpt::Entry::sharded(e.global_shape(), std::move(shards));
    } else {
      out[key] = e;
    }
  }
  return out;
}

bool same_tensors(const ckpt::State& a, const ckpt::State& b) {
  for (const auto& [key, e] : a) {
    const auto& f = b.at(key);
    if (e.kind() == ckpt::Entry::Kind::kTensor && !torch::equal(e.tensor(), f.tensor())) return false;
    if (e.kind() == ckpt::Entry::Kind::kSharded)
      for (size_t i = 0; i < e.shards().size(); ++i)
        if (!torch::equal(e.shards()[i].tensor, f.shards()[i].tensor)) return false;
  }
  return true;
}

// The size of the data file this rank wrote (0 when it wrote none).
double data_file_bytes(const std::string& dir, int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "/rank-%05d.safetensors", rank);
  std::error_code ec;
  const auto size = std::filesystem::file_size(dir + name, ec);
  return ec ? 0.0 : static_cast<double>(size);
}

// Rank 0 flushes dirty pages and drops the page cache (root only); true on every rank when it did.
bool drop_caches(const fsdpp::ProcessGroup& group) {
  double ok = 0;
  if (group.rank() == 0) {
    ::sync();
    std::ofstream f("/proc/sys/vm/drop_caches");
    f << "3" << std::flush;
    ok = f.good() ? 1 : 0;
  }
  at::Tensor t = torch::tensor({ok}, torch::kDouble);
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MAX, group);
  return t.item<double>() > 0;
}

bool all_true(bool mine, const fsdpp::ProcessGroup& group) {
  at::Tensor t = torch::tensor({mine ? 1.0 : 0.0}, torch::kDouble);
  fsdpp::all_reduce(t, fsdpp::ReduceOp::MIN, group);
  return t.item<double>() > 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdpp distributed checkpoint: save/load throughput and training stall"};
  TransformerArgs args;
  args.n_layers = 5;
  args.dim = 1024;
  args.vocab_size = 1024;
  args.max_seq_len = 16;
  args.n_heads = 8;
  int64_t local_batch = 1;
  int steps = 3, max_async_steps = 12, reps = 3;
  std::string dir, keep, reshard_from;
  bool want_drop = false, export_only = false;
  app.add_option("--layers", args.n_layers);
  app.add_option("--dim", args.dim);
  app.add_option("--vocab", args.vocab_size);
  app.add_option("--local-batch", local_batch);
  app.add_option("--steps", steps, "steps timed for the baseline step time");
  app.add_option("--reps", reps, "sync saves and cold loads timed (the first save goes to --keep)");
  app.add_option("--max-async-steps", max_async_steps, "at most this many steps while an async save writes");
  app.add_option("--dir", dir, "scratch directory for the checkpoints of this run")->required();
  app.add_option("--keep", keep, "save the initial model here too (for a later --reshard-from)");
  app.add_option("--reshard-from", reshard_from, "also load the initial model from this checkpoint (saved at another N)");
  app.add_flag("--drop-caches", want_drop, "drop the page cache before cold loads (needs root)");
  app.add_flag("--export", export_only, "only time export_safetensors and its memory peak, then exit");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  auto world = fsdpp::init_process_group(fsdpp::InitProcessGroupOptions().check_collectives(false));
  const int rank = world.rank(), n = world.size();
  auto say = [&](const char* fmt, auto... a) {
    if (rank == 0) {
      std::printf(fmt, a...);
      std::fflush(stdout);
    }
  };
  if (keep.empty()) keep = dir + "/initial";

  torch::manual_seed(rank);
  at::Tensor tokens = torch::randint(args.vocab_size, {local_batch, args.max_seq_len}, torch::kLong);
  at::Tensor targets = torch::randint(args.vocab_size, {local_batch, args.max_seq_len}, torch::kLong);

  // The same initial model at every N (seed 0), so a load resharded from another N is checkable.
  auto start = Clock::now();
  torch::manual_seed(0);
  auto model = fsdpp::fully_shard(
      Transformer(args), fsdpp::FullyShardOptions().auto_wrap_policy(fsdpp::ModuleWrapPolicy<TransformerBlockImpl>()));
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-5));
  const double build_s = seconds_since(start);

  if (export_only) {
    double full = 0, largest_tensor = 0, largest_unit = 0;
    for (const auto& m : model->modules()) {
      auto* unit = dynamic_cast<fsdpp::FSDPModule*>(m.get());
      if (!unit) continue;
      double unit_bytes = 0;
      for (const auto& p : unit->sharded_parameters()) {
        const double b = static_cast<double>(p.layout.numel() * p.param.element_size());
        unit_bytes += b;
        largest_tensor = std::max(largest_tensor, b);
      }
      full += unit_bytes;
      largest_unit = std::max(largest_unit, unit_bytes);
    }
    const std::string file = dir + "/model.safetensors";
    if (rank == 0) std::filesystem::create_directories(dir);
    fsdpp::barrier(world);
    const double before = static_cast<double>(fsdpp::memory_stats().current_bytes);
    fsdpp::reset_peak_memory_stats();
    start = Clock::now();
    ckpt::export_safetensors(model, file, {{"bench", "bench_checkpoint --export"}});
    const double t = seconds_since(start);
    const auto times = gather(t, world);
    const auto peaks = gather(static_cast<double>(fsdpp::memory_stats().peak_bytes) - before, world);
    say("N=%d export_safetensors: %.1f MiB model (%.2f x its largest unit of %.2f MiB; largest tensor %.2f MiB) "
        "to one file in %.3f s (slowest rank), %.0f MiB/s\n",
        n, mib(full), full / largest_unit, mib(largest_unit), mib(largest_tensor), max_of(times), mib(full) / max_of(times));
    for (int r = 0; r < n; ++r)
      say("  rank %d: peak above its state %.2f MiB = %.3f x largest tensor, %.3f x largest unit, %.4f x full model\n", r,
          mib(peaks[r]), peaks[r] / largest_tensor, peaks[r] / largest_unit, peaks[r] / full);
    say("RESULT n=%d export_s=%.4f export_rank0_peak_mib=%.3f largest_tensor_mib=%.3f largest_unit_mib=%.3f full_mib=%.3f\n",
        n, max_of(times), mib(peaks[0]), mib(largest_tensor), mib(largest_unit), mib(full));
    if (rank == 0) std::filesystem::remove(file);
    {  // For contrast: the FULL state dict on rank 0 alone (rank0_only + offload), what a
       // non-streamed export would build first.
      fsdpp::barrier(world);
      const double held = static_cast<double>(fsdpp::memory_stats().current_bytes);
      fsdpp::reset_peak_memory_stats();
      { auto sd = fsdpp::get_model_state_dict(model, fsdpp::StateDictOptions().full_state_dict(true).cpu_offload(true)); }
      const auto full_peaks = gather(static_cast<double>(fsdpp::memory_stats().peak_bytes) - held, world);
      say("  for contrast, get_model_state_dict(full_state_dict, cpu_offload) peaks at %.2f MiB above rank 0's state "
          "(%.3f x full model)\n", mib(full_peaks[0]), full_peaks[0] / full);
      say("RESULT n=%d full_state_dict_rank0_peak_mib=%.3f\n", n, mib(full_peaks[0]));
    }
    fsdpp::barrier(world);
    return 0;
  }

  fsdpp::StateDict sd0 = fsdpp::get_model_state_dict(model);  // SHARDED; a copy
  const ckpt::State initial = ckpt::to_state(sd0, "model.");
  const double my_bytes = tensor_bytes(initial);
  const auto rank_bytes = gather(my_bytes, world);
  const double total_bytes = sum_of(rank_bytes);
  say("N=%d model: %lld layers, dim %lld, vocab %lld, %zu tensors, %.1f MiB float32 in all, %.1f MiB on rank 0; "
      "built and sharded in %.1f s\n",
      n, static_cast<long long>(args.n_layers), static_cast<long long>(args.dim),
      static_cast<long long>(args.vocab_size), initial.size(), mib(total_bytes), mib(my_bytes), build_s);
  say("RESULT n=%d total_mib=%.2f\n", n, mib(total_bytes));

  // The median of a few repetitions and their range: this disk and machine are noisy.
  auto summary = [&](const char* what, const char* key, std::vector<double> v) {
    std::sort(v.begin(), v.end());
    say("%s, median of %zu: %.0f MiB/s (range %.0f-%.0f)\n", what, v.size(), v[v.size() / 2], v.front(), v.back());
    say("RESULT n=%d %s_median_mibps=%.1f %s_min_mibps=%.1f %s_max_mibps=%.1f\n", n, key, v[v.size() / 2], key,
        v.front(), key, v.back());
  };

  // ---- sync save throughput: the first to --keep, from a quiet page cache -----------------------
  if (rank == 0) ::sync();
  std::vector<double> save_rank0, save_aggregate;
  for (int rep = 0; rep < reps; ++rep) {
    const std::string target = rep == 0 ? keep : dir + "/sync" + std::to_string(rep);
    fsdpp::barrier(world);
    start = Clock::now();
    ckpt::save(initial, target);
    const double t = seconds_since(start);
    const auto times = gather(t, world);
    const auto bytes = gather(data_file_bytes(target, rank), world);
    say("sync save %d: slowest rank %.3f s; per rank MiB/s:", rep + 1, max_of(times));
    for (int r = 0; r < n; ++r) say(" %.0f", mib(bytes[r]) / times[r]);
    say("; aggregate %.0f MiB/s (%.1f MiB written)\n", mib(sum_of(bytes)) / max_of(times), mib(sum_of(bytes)));
    save_rank0.push_back(mib(bytes[0]) / times[0]);
    save_aggregate.push_back(mib(sum_of(bytes)) / max_of(times));
    say("RESULT n=%d save%d_s=%.4f save%d_rank0_mibps=%.1f save%d_min_rank_mibps=%.1f save%d_aggregate_mibps=%.1f\n",
        n, rep + 1, max_of(times), rep + 1, mib(bytes[0]) / times[0], rep + 1,
        [&] { double m = 1e30; for (int r = 0; r < n; ++r) if (bytes[r] > 0) m = std::min(m, mib(bytes[r]) / times[r]); return m; }(),
        rep + 1, mib(sum_of(bytes)) / max_of(times));
    if (rep >= 2 && rank == 0) std::filesystem::remove_all(target);  // keep one copy to load from
  }
  summary("sync save, rank 0 MiB/s", "save_rank0", save_rank0);
  summary("sync save, aggregate MiB/s", "save_aggregate", save_aggregate);

  // ---- load throughput --------------------------------------------------------------------------
  auto timed_load = [&](const std::string& from, const char* label, bool cold, const ckpt::LoadOptions& options) -> std::pair<double, double> {
    bool dropped = false;
    if (cold && want_drop) dropped = drop_caches(world);
    ckpt::State target = blank_like(initial);
    fsdpp::barrier(world);
    const auto t0 = Clock::now();
    ckpt::load(target, from, options);
    const double t = seconds_since(t0);
    const bool ok = all_true(same_tensors(initial, target), world);
    const auto times = gather(t, world);
    say("load %s (%s, verify %s): slowest rank %.3f s; per rank MiB/s:", label,
        cold ? (dropped ? "page cache dropped" : "page cache NOT dropped") : "warm page cache",
        options.verify() ? "on" : "off", max_of(times));
    for (int r = 0; r < n; ++r) say(" %.0f", mib(rank_bytes[r]) / times[r]);
    say("; aggregate %.0f MiB/s; contents %s\n", mib(total_bytes) / max_of(times), ok ? "match" : "DIFFER");
    say("RESULT n=%d load_%s_%s_s=%.4f load_%s_%s_rank0_mibps=%.1f load_%s_%s_aggregate_mibps=%.1f load_%s_%s_ok=%d\n",
        n, label, cold ? "cold" : "warm", max_of(times), label, cold ? "cold" : "warm", mib(my_bytes) / times[0], label,
        cold ? "cold" : "warm", mib(total_bytes) / max_of(times), label, cold ? "cold" : "warm", ok ? 1 : 0);
    if (!ok) throw fsdpp::Error("bench_checkpoint: the loaded tensors differ from the saved ones");
    return {mib(rank_bytes[0]) / times[0], mib(total_bytes) / max_of(times)};
  };
  const std::string saved = dir + "/sync1";
  std::vector<double> load_rank0, load_aggregate;
  for (int rep = 0; rep < std::max(1, reps - 1); ++rep) {
    const auto [r0, agg] = timed_load(saved, "same", /*cold=*/true, ckpt::LoadOptions());
    load_rank0.push_back(r0);
    load_aggregate.push_back(agg);
  }
  summary("cold load, rank 0 MiB/s", "load_rank0", load_rank0);
  summary("cold load, aggregate MiB/s", "load_aggregate", load_aggregate);
  timed_load(saved, "same", /*cold=*/false, ckpt::LoadOptions());
  if (!reshard_from.empty()) {
    const int from_n = ckpt::read_metadata(reshard_from).world_size;
    say("resharded load from N=%d (%s), verify off (only the rows needed are read):\n", from_n, reshard_from.c_str());
    say("RESULT n=%d reshard_from_n=%d\n", n, from_n);
    timed_load(reshard_from, "reshard", /*cold=*/true, ckpt::LoadOptions().verify(false));
  }
  {  // Loading into the model itself: checkpoint::load into the state dict, then set_model_state_dict.
    fsdpp::StateDict sd = fsdpp::get_model_state_dict(model);
    ckpt::State s = ckpt::to_state(sd, "model.");
    fsdpp::barrier(world);
    const auto t0 = Clock::now();
    ckpt::load(s, saved);
    const double t_load = seconds_since(t0);
    const auto t1 = Clock::now();
    fsdpp::set_model_state_dict(model, sd);
    const double t_set = seconds_since(t1);
    say("load into the model (warm): checkpoint::load %.3f s + set_model_state_dict %.3f s (slowest rank)\n",
        max_of(gather(t_load, world)), max_of(gather(t_set, world)));
  }

  // ---- training stall ---------------------------------------------------------------------------
  auto step = [&] {
    opt.zero_grad();
    language_model_loss(model->forward(tokens), targets).backward();
    opt.step();
  };
  auto timed_step = [&] {
    fsdpp::barrier(world);
    const auto t0 = Clock::now();
    step();
    return seconds_since(t0);
  };
  timed_step();  // Adam state exists from here on
  std::vector<double> base;
  for (int i = 0; i < steps; ++i) base.push_back(max_of(gather(timed_step(), world)));
  std::sort(base.begin(), base.end());
  const double base_step = base[base.size() / 2];
  say("training step (slowest rank), median of %d: %.3f s (range %.3f-%.3f)\n", steps, base_step, base.front(), base.back());
  say("RESULT n=%d step_s=%.4f\n", n, base_step);

  // A sync save between two steps: the training stalls for the state dict plus the save.
  if (rank == 0) ::sync();
  fsdpp::barrier(world);
  start = Clock::now();
  double t_sd = 0;
  {
    fsdpp::StateDict sd = fsdpp::get_model_state_dict(model);
    t_sd = seconds_since(start);
    ckpt::save(ckpt::to_state(sd, "model."), dir + "/sync-train");
  }
  const double sync_stall = max_of(gather(seconds_since(start), world));
  const double sync_sd = max_of(gather(t_sd, world));
  say("sync save between steps: %.3f s (state dict %.3f s + save %.3f s)\n", sync_stall, sync_sd, sync_stall - sync_sd);
  say("RESULT n=%d sync_stall_s=%.4f state_dict_s=%.4f\n", n, sync_stall, sync_sd);

  // An async save: the call returns once the state is staged; train on while it writes.
  if (rank == 0) ::sync();
  fsdpp::barrier(world);
  start = Clock::now();
  ckpt::SaveHandle handle;
  {
    fsdpp::StateDict sd = fsdpp::get_model_state_dict(model);
    t_sd = seconds_since(start);
    handle = ckpt::async_save(ckpt::to_state(sd, "model."), dir + "/async");
  }
  const double t_call = seconds_since(start);
  std::vector<double> during;
  while (static_cast<int>(during.size()) < max_async_steps) {
    if (all_true(handle.done(), world)) break;  // every rank takes the same number of steps
    during.push_back(max_of(gather(timed_step(), world)));
  }
  const auto t_wait0 = Clock::now();
  handle.wait();
  const double t_wait = max_of(gather(seconds_since(t_wait0), world));
  const double t_total = max_of(gather(seconds_since(start), world));
  const double async_call = max_of(gather(t_call, world));
  const double async_sd = max_of(gather(t_sd, world));
  const double during_sum = sum_of(during);
  const double during_mean = during.empty() ? 0 : during_sum / during.size();
  const double extra = during_sum - base_step * during.size();
  say("async save: call returned after %.3f s (state dict %.3f s + async_save %.3f s) vs sync %.3f s; "
      "%zu steps while writing, mean %.3f s vs %.3f s without (+%.3f s in all); wait() then blocked %.3f s; "
      "%.3f s from the call until wait() returned\n",
      async_call, async_sd, async_call - async_sd, sync_stall, during.size(), during_mean, base_step, extra, t_wait,
      t_total);
  say("training blocked by the save: async %.3f s (call + wait) vs sync %.3f s; the steps overlapping the write "
      "took %+.3f s vs the median step (the baseline steps spread over %.3f s)\n",
      async_call + t_wait, sync_stall, extra, base.back() - base.front());
  say("RESULT n=%d async_call_s=%.4f async_steps=%zu async_step_mean_s=%.4f async_extra_s=%.4f async_wait_s=%.4f "
      "async_total_s=%.4f async_blocked_s=%.4f\n",
      n, async_call, during.size(), during_mean, extra, t_wait, t_total, async_call + t_wait);
  // The writer's own duration: the steps above end on a step boundary, so time an async save
  // whose caller waits right away (nothing else runs).
  if (rank == 0) ::sync();
  fsdpp::barrier(world);
  start = Clock::now();
  ckpt::SaveHandle idle = ckpt::async_save(initial, dir + "/async-idle");
  const double idle_call = max_of(gather(seconds_since(start), world));
  idle.wait();
  const double idle_total = max_of(gather(seconds_since(start), world));
  say("async save waited on at once: call %.3f s, wait() returned after %.3f s in all (%.0f MiB/s aggregate) "
      "vs sync save %.3f s\n", idle_call, idle_total, mib(total_bytes) / idle_total, sync_stall - sync_sd);
  say("RESULT n=%d async_idle_call_s=%.4f async_idle_total_s=%.4f\n", n, idle_call, idle_total);
  // Steps after the async save finished, to see the baseline is back (the machine is shared).
  std::vector<double> after;
  for (int i = 0; i < steps; ++i) after.push_back(max_of(gather(timed_step(), world)));
  std::sort(after.begin(), after.end());
  say("training step after the async save, median of %d: %.3f s\n", steps, after[after.size() / 2]);
  say("RESULT n=%d step_after_s=%.4f\n", n, after[after.size() / 2]);
  fsdpp::barrier(world);
  return 0;
}

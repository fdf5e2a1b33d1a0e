// Collective save: agree on a plan (save_planner: who writes which chunk; data_file_layout:
// where), write one safetensors file per rank into DIR.tmp-<id>, gather checksums, then rank 0
// writes the metadata last and atomically and moves the directory into place.
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/memory.h>

#include "checkpoint/comm.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/metadata.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/save_plan.h"
#include "comm/error_message.h"

namespace fsdpp::checkpoint {

using nlohmann::json;
namespace fs = std::filesystem;
using namespace detail;

namespace {

// Test hook: after every data file is durable and before the metadata is written, group rank
// 0 creates the file this variable names and sleeps, so a test can kill it right there.
void maybe_pause_before_metadata() {
  const char* marker = std::getenv("FSDPP_CHECKPOINT_TEST_PAUSE_BEFORE_METADATA");
  if (!marker || !*marker) return;
  FILE* f = std::fopen(marker, "w");
  if (f) std::fclose(f);
  std::this_thread::sleep_for(std::chrono::minutes(10));
}

std::string normalize_dir(const std::string& dir) {
  if (dir.empty()) throw Error("checkpoint::save: the directory name is empty");
  std::string d = fs::path(dir).lexically_normal().string();
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

// Rank 0: checks DIR may be replaced and creates the staging directory next to it.
std::string make_staging(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw Error("checkpoint::save: " + dir + " exists and is not a directory");
    const bool empty = fs::is_empty(dir, ec);
    const bool checkpoint = fs::exists(fs::path(dir) / kMetadataFile, ec);
    if (!empty && !checkpoint)
      throw Error("checkpoint::save: " + dir + " exists and is not an fsdpp checkpoint; refusing to replace it");
  }
  const fs::path parent = fs::path(dir).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) throw Error("checkpoint::save: cannot create " + parent.string() + ": " + ec.message());
  }
  std::random_device rd;
  char id[32];
  std::snprintf(id, sizeof(id), "%d-%08x", static_cast<int>(::getpid()), rd());
  const std::string staging = dir + ".tmp-" + id;
  if (!fs::create_directory(staging, ec) || ec)
    throw Error("checkpoint::save: cannot create " + staging + ": " + (ec ? ec.message() : "it exists"));
  return staging;
}

// Rank 0: the staged directory becomes DIR in one step (renameat2 RENAME_EXCHANGE swaps it with
// a previous checkpoint atomically); the previous checkpoint is removed only afterwards.
void install(const std::string& staging, const std::string& dir) {
  const std::string parent = fs::path(dir).parent_path().empty() ? "." : fs::path(dir).parent_path().string();
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(staging.c_str(), dir.c_str()) != 0)
      throw Error("checkpoint::save: cannot rename " + staging + " to " + dir + ": " + std::strerror(errno));
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    fsync_dir(parent);
    remove_tree(staging);  // now holds the previous checkpoint
    return;
  } else {
    // No atomic exchange on this file system: move the old one aside first.
    const std::string old = staging + ".old";
    if (::rename(dir.c_str(), old.c_str()) != 0 || ::rename(staging.c_str(), dir.c_str()) != 0)
      throw Error("checkpoint::save: cannot replace " + dir + " with " + staging + ": " + std::strerror(errno));
    fsync_dir(parent);
    remove_tree(old);
    return;
  }
  fsync_dir(parent);
}

struct Job {
  Comm comm;
  std::string dir, staging;
  GlobalPlan plan;
  Staged staged;
};

// Writes this rank's data file; returns its chunks' checksums, or throws.
std::vector<std::string> write_data(const Job& job) {
  const int r = job.comm.rank;
  const auto& writes = job.plan.writes[r];
  std::vector<std::string> sums;
  if (writes.empty()) return sums;
  std::map<std::pair<std::string, std::vector<int64_t>>, const Item*> mine;
  for (const auto& it : job.staged.items)
    if (it.data.defined()) mine[{it.key, it.box.offsets}] = &it;  // empty shards write nothing
  const std::string path = job.staging + "/" + data_file_name(r);
  File f = File::create(path);
  const auto& layout = job.plan.layouts[r];
  f.write_all(layout.prefix.data(), static_cast<int64_t>(layout.prefix.size()), "the safetensors header");
  for (const auto& c : writes) {
    const Item& it = *mine.at({c.key, c.box.offsets});
    const auto bytes = static_cast<int64_t>(it.data.nbytes());
    sums.push_back(xxh3_hex(it.data.data_ptr(), static_cast<size_t>(bytes)));
    f.write_all(it.data.data_ptr(), bytes, "tensor '" + c.key + "'");
  }
  f.sync();
  return sums;
}

Metadata build_metadata(const Job& job, const std::vector<std::vector<std::string>>& sums) {
  Metadata m;
  m.world_size = job.comm.size;
  for (const auto& [key, t] : job.plan.tensors) {
    EntryInfo& e = m.entries[key];
    e.kind = Entry::Kind::kTensor;
    e.dtype = t.first;
    e.shape = t.second;
  }
  for (int r = 0; r < job.comm.size; ++r) {
    const auto& writes = job.plan.writes[r];
    if (writes.empty()) continue;
    const std::string file = data_file_name(r);
    m.files.push_back(file);
    m.file_sizes[file] = job.plan.layouts[r].file_size;
    for (size_t i = 0; i < writes.size(); ++i) {
      ChunkInfo c;
      c.offsets = writes[i].box.offsets;
      c.sizes = writes[i].box.sizes;
      c.file = file;
      c.name = chunk_name(writes[i].key, c.offsets);
      c.begin = job.plan.layouts[r].ranges[i].first;
      c.end = job.plan.layouts[r].ranges[i].second;
      c.xxh3_64 = sums[r].at(i);
      m.entries[writes[i].key].chunks.push_back(std::move(c));
    }
  }
  for (const auto& [key, v] : job.staged.values) {
    EntryInfo& e = m.entries[key];
    e.kind = v.kind();
    e.value = v;
  }
  return m;
}

// Everything after the plan: data files, checksums, metadata, rename. Runs on the caller's
// thread (save) or a background one (async_save, with its own process group).
void write_and_commit(const Job& job) {
  std::string result;
  std::vector<std::string> sums;
  try {
    sums = write_data(job);
  } catch (const std::exception& e) {
    result = fsdpp::detail::message_without_backtrace(e);
  }
  const auto all = job.comm.all_gather(json({{"error", result}, {"sums", sums}}).dump());
  std::string errors;
  std::vector<std::vector<std::string>> all_sums;
  for (int r = 0; r < job.comm.size; ++r) {
    const json j = json::parse(all[r]);
    const std::string e = without_prefix(j["error"].get<std::string>());
    if (!e.empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
    all_sums.push_back(j["sums"].get<std::vector<std::string>>());
  }
  std::string outcome;
  if (job.comm.rank == 0) {
    if (!errors.empty()) {
      remove_tree(job.staging);
      outcome = "checkpoint::save to " + job.dir + " failed (the previous checkpoint there, if any, is untouched): " +
                errors;
    } else {
      bool written = false;
      try {
        maybe_pause_before_metadata();
        write_file_atomically(job.staging, kMetadataFile, metadata_to_json(build_metadata(job, all_sums)));
        written = true;
        install(job.staging, job.dir);
      } catch (const std::exception& e) {
        // Without metadata the staged files are of no use; once complete, they are kept (a
        // failed rename leaves the new checkpoint at the staging path).
        if (!written) remove_tree(job.staging);
        outcome = "checkpoint::save to " + job.dir + " failed: rank " + std::to_string(job.comm.rank) + ": " +
                  without_prefix(e.what()) + (written ? "" : " (the previous checkpoint there, if any, is untouched)");
      }
    }
  }
  job.comm.broadcast(outcome);
  if (!outcome.empty()) throw Error(without_prefix(outcome));
}

// Plans a save collectively; throws on every rank alike when a rank's state is bad.
Job prepare(const State& state, const std::string& dir, const SaveOptions& options, bool clone) {
  Job job;
  job.comm = Comm::of(options.process_group(), "checkpoint::save");
  job.dir = normalize_dir(dir);
  job.staged = stage(state, clone);
  job.plan = make_plan(job.comm.all_gather(plan_of(job.staged)));
  std::string staging;
  if (job.comm.rank == 0) {
    try {
      staging = "+" + make_staging(job.dir);
    } catch (const std::exception& e) {
      staging = std::string("!") + e.what();
    }
  }
  job.comm.broadcast(staging);
  if (staging.empty() || staging[0] == '!') throw Error(without_prefix(staging.substr(std::min<size_t>(staging.size(), 1))));
  job.staging = staging.substr(1);
  return job;
}

// One save at a time per process: a save first waits for an async one still writing.
std::mutex g_pending_mutex;
std::shared_future<void> g_pending;

void wait_for_pending() {
  std::shared_future<void> pending;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    pending = g_pending;
  }
  if (pending.valid()) pending.wait();  // its error belongs to its own handle
}

}  // namespace

void save(const State& state, const std::string& dir, const SaveOptions& options) {
  wait_for_pending();
  write_and_commit(prepare(state, dir, options, /*clone=*/false));
}

struct SaveHandle::Impl {
  std::shared_future<void> future;
};

namespace {

// Why this rank's staged copy would not fit its memory limit beside its peak since the last
// reset (training needs that much again while the copy is written), or "" when it fits.
std::string staged_copy_does_not_fit(const State& state, int rank) {
  const int64_t limit = memory_limit();
  if (limit <= 0) return "";
  int64_t copy = 0;
  for (const auto& [key, e] : state) {
    if (e.kind() == Entry::Kind::kTensor) copy += static_cast<int64_t>(e.tensor().nbytes());
    if (e.kind() == Entry::Kind::kSharded)
      for (const auto& shard : e.shards()) copy += static_cast<int64_t>(shard.tensor.nbytes());
  }
  const MemoryStats now = memory_stats();
  const int64_t in_use = std::max(now.current_bytes, now.peak_bytes);
  if (in_use + copy <= limit) return "";
  auto mib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
    return std::string(text);
  };
  return "rank " + std::to_string(rank) + "'s staged copy (" + mib(copy) + ") does not fit beside its peak of " +
         mib(in_use) + " under its memory limit of " + mib(limit);
}

}  // namespace

SaveHandle async_save(const State& state, const std::string& dir, const SaveOptions& options) {
  wait_for_pending();
  // A staged copy that does not fit would end the run it is meant to keep: every rank then saves
  // now, synchronously and straight from its own tensors (no copy), and rank 0 says so.
  const Comm comm = Comm::of(options.process_group(), "checkpoint::async_save");
  std::string why;
  for (const std::string& verdict : comm.all_gather(staged_copy_does_not_fit(state, comm.rank)))
    if (why.empty()) why = verdict;
  if (!why.empty()) {
    if (comm.rank == 0)
      std::fprintf(stderr, "fsdpp: checkpoint::async_save to %s: %s; saving synchronously, without a copy\n",
                   dir.c_str(), why.c_str());
    std::promise<void> done;
    try {
      save(state, dir, options);
      done.set_value();
    } catch (...) {
      done.set_exception(std::current_exception());
    }
    auto impl = std::make_shared<SaveHandle::Impl>();
    impl->future = done.get_future().share();
    return SaveHandle(impl);
  }
  auto job = std::make_shared<Job>(prepare(state, dir, options, /*clone=*/true));
  // The background writer talks on its own group, so its collectives never interleave with
  // the ones training issues meanwhile.
  if (!job->comm.alone) job->comm.group = job->comm.group.new_group(job->comm.group.ranks());
  auto impl = std::make_shared<SaveHandle::Impl>();
  impl->future = std::async(std::launch::async, [job]() mutable {
                   write_and_commit(*job);
                   job.reset();
                 }).share();
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  g_pending = impl->future;
  return SaveHandle(impl);
}

void SaveHandle::wait() {
  if (impl_) impl_->future.get();
}

bool SaveHandle::done() const {
  return !impl_ || impl_->future.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

}  // namespace fsdpp::checkpoint

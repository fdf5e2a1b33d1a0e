// Streamed full export: a model's full state dict to standard safetensors files (one, or a
// Hugging Face directory's shards), written by rank 0 while each sharded tensor is gathered to
// it one at a time (issue 14).
//
// 1. Plan (rank 0): the files and their headers follow from rank 0's keys, dtypes and global
//    shapes alone; rank 0 sends the plan (per entry: whole or sharded, dtype, shape, the
//    sharding group's ranks, its file) to every rank.
// 2. Agree: each rank checks its own dict against the plan; every rank's error goes to every
//    rank (the pattern of checkpoint::save), so all throw or none.
// 3. Stream: per entry in order, rank 0 writes a whole tensor from its dict; a ShardedTensor
//    whose group holds rank 0 is gathered to rank 0 by one all_to_all_single in which only rank
//    0 receives (each other rank sends its rows once; ranks outside that group skip), written
//    at its place and freed. A failed write stops the writing but not the gathering, so the
//    other ranks never wait on rank 0.
//    Each file is written as FILE.tmp-<pid>, in plan order.
// 4. Commit: rank 0 fsyncs and renames the files into place (or removes them); its outcome goes
//    to every rank.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/grad_mode.h>

#include <fsdpp/checkpoint.h>
#include <fsdpp/collectives.h>
#include <fsdpp/error.h>
#include <fsdpp/model_layout.h>
#include <fsdpp/state_dict.h>

#include "checkpoint/comm.h"
#include "checkpoint/file_io.h"
#include "checkpoint/format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/streamed_export.h"

namespace fsdpp::checkpoint {

using nlohmann::json;
using namespace detail;

namespace {

constexpr const char* kApi = "export_safetensors";

// The global ranks of the group a ShardedTensor is sharded over (an empty group: the default
// group, or this process alone).
std::vector<int> ranks_of(const ProcessGroup& g) {
  if (g.defined()) return g.ranks();
  if (is_initialized()) return default_group().ranks();
  return {0};
}

bool contains(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// One entry of the file, as rank 0 plans it.
struct PlannedEntry {
  std::string key;
  bool sharded = false;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<int> group;  // sharded: the global ranks of its group
  int file = 0;            // index into the export's files
};

json plan_to_json(const std::vector<PlannedEntry>& plan) {
  json out = json::array();
  for (const auto& e : plan)
    out.push_back({{"key", e.key}, {"sharded", e.sharded}, {"dtype", static_cast<int>(e.dtype)},
                   {"shape", e.shape}, {"group", e.group}, {"file", e.file}});
  return out;
}

std::vector<PlannedEntry> plan_from_json(const json& j) {
  std::vector<PlannedEntry> plan;
  for (const auto& e : j) {
    PlannedEntry p;
    p.key = e.at("key").get<std::string>();
    p.sharded = e.at("sharded").get<bool>();
    p.dtype = static_cast<at::ScalarType>(e.at("dtype").get<int>());
    p.shape = e.at("shape").get<std::vector<int64_t>>();
    p.group = e.at("group").get<std::vector<int>>();
    p.file = e.at("file").get<int>();
    plan.push_back(std::move(p));
  }
  return plan;
}

// The dtype an entry is written in: `cast` for floating tensors, else its own.
at::ScalarType written_dtype(at::ScalarType own, const std::optional<at::ScalarType>& cast) {
  return cast && at::isFloatingType(own) ? *cast : own;
}

std::vector<PlannedEntry> make_plan(const StateDict& sd, const ExportTarget& target) {
  std::vector<PlannedEntry> plan;
  for (const auto& [key, value] : sd) {
    if (target.skip.count(key)) continue;
    PlannedEntry p;
    p.key = key;
    p.sharded = value.is_sharded();
    p.dtype = written_dtype(value.dtype(), target.dtype);
    p.shape = value.sizes();
    if (p.sharded) {
      p.group = ranks_of(value.sharded_tensor().process_group());
      if (!contains(p.group, 0))
        throw Error("'" + key + "' is a ShardedTensor over global ranks " + shape_string(std::vector<int64_t>(p.group.begin(), p.group.end())) +
                    ", which do not include rank 0, the rank that writes");
    }
    plan.push_back(std::move(p));
  }
  return plan;
}

// This rank's problems with its own dict against rank 0's plan ("" when none).
std::string check_against_plan(const StateDict& sd, const std::vector<PlannedEntry>& plan, int rank,
                               const std::optional<at::ScalarType>& cast) {
  for (const auto& p : plan) {
    if (!p.sharded || !contains(p.group, rank)) continue;
    const StateDictValue* v = sd.find(p.key);
    if (!v) return "its state dict has no '" + p.key + "', which rank 0 holds as a ShardedTensor";
    if (!v->is_sharded()) return "'" + p.key + "' is a whole tensor here but a ShardedTensor on rank 0";
    if (written_dtype(v->dtype(), cast) != p.dtype || v->sizes() != p.shape)
      return "'" + p.key + "' is " + c10::toString(v->dtype()) + " " + shape_string(v->sizes()) + " here but " +
             c10::toString(p.dtype) + " " + shape_string(p.shape) + " on rank 0";
    if (ranks_of(v->sharded_tensor().process_group()) != p.group)
      return "'" + p.key + "' is sharded over another group here than on rank 0";
  }
  return "";
}

// Rank 0's part of the export: the files (final names and temporaries), the open one, and the
// first write error, after which nothing more is written (but every gather still runs, so no
// other rank waits on rank 0).
struct Writer {
  std::vector<std::string> files, tmps, prefixes;  // prefixes: each file's header bytes
  int current = -1;
  File out;
  std::string error;
  std::optional<at::ScalarType> cast;

  // Moves to file `i` (closing the one before), creating it with its header.
  void enter(int i) {
    if (i == current || !error.empty()) return;
    try {
      if (current >= 0) {
        out.sync();
        out = File();
      }
      current = i;
      out = File::create(tmps[i]);
      out.write_all(prefixes[i].data(), static_cast<int64_t>(prefixes[i].size()), "the safetensors header");
    } catch (const std::exception& e) {
      error = without_prefix(e.what());
    }
  }
  void remove_all() {
    out = File();
    for (const auto& t : tmps) std::remove(t.c_str());
  }

  void write(const void* data, int64_t bytes, const std::string& what) {
    if (!error.empty() || bytes == 0) return;
    try {
      out.write_all(data, bytes, what);
    } catch (const std::exception& e) {
      error = without_prefix(e.what());
    }
  }
  void write(const at::Tensor& t, const std::string& what) {
    if (!error.empty()) return;
    at::Tensor c;
    try {  // the copies may run out of memory: an error like a failed write, on rank 0 alone
      c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
      if (cast && at::isFloatingType(c.scalar_type())) c = c.to(*cast);
    } catch (const std::exception& e) {
      error = "preparing " + what + ": " + without_prefix(e.what());
      return;
    }
    write(c.data_ptr(), static_cast<int64_t>(c.nbytes()), what);
  }
};

// Whether shard `m` of a tensor of `shape` is a block of whole dim-0 rows, whose bytes are then
// one contiguous range of the tensor's.
bool is_row_block(const ShardMetadata& m, const std::vector<int64_t>& shape) {
  if (shape.empty() || m.shard_offsets.size() != shape.size()) return false;
  for (size_t d = 1; d < shape.size(); ++d)
    if (m.shard_offsets[d] != 0 || m.shard_sizes[d] != shape[d]) return false;
  return true;
}

// Streams one ShardedTensor: every member of its group calls; rank 0 (global) receives each
// rank's shards flattened, in the group's rank order, and writes them in file order.
void stream_sharded(const ShardedTensor& st, const PlannedEntry& p, int global_rank, Writer* writer) {
  const std::string what = "tensor '" + p.key + "'";
  const int64_t numel = st.numel();
  if (numel == 0) return;
  const auto& group = st.process_group();
  const int n = static_cast<int>(p.group.size());
  const int root = static_cast<int>(std::find(p.group.begin(), p.group.end(), 0) - p.group.begin());
  const int me = static_cast<int>(std::find(p.group.begin(), p.group.end(), global_rank) - p.group.begin());
  const auto& shards = st.local_shards();
  const at::Device device = shards.empty() ? at::Device(at::kCPU) : shards.front().tensor.device();
  const auto options = at::TensorOptions().dtype(st.dtype()).device(device);

  // Every shard's data (flattened), in shards_metadata() order; rank 0 only.
  std::vector<at::Tensor> pieces;
  at::Tensor received;  // holds the pieces; freed when this returns
  if (n == 1) {
    for (const auto& m : st.shards_metadata()) pieces.push_back(st.local_shard(m).reshape({-1}));
  } else {
    // This rank's shards, one after another (a view when it holds one contiguous shard).
    at::Tensor input;
    if (shards.size() == 1) {
      input = shards.front().tensor.contiguous().reshape({-1});
    } else if (shards.empty()) {
      input = at::empty({0}, options);
    } else {
      std::vector<at::Tensor> flat;
      for (const auto& s : shards) flat.push_back(s.tensor.reshape({-1}));
      input = at::cat(flat);
    }
    std::vector<int64_t> input_splits(n, 0), output_splits(n, 0);
    input_splits[root] = input.numel();
    if (me == root) {
      for (const auto& m : st.shards_metadata()) output_splits[m.placement] += m.numel();
      received = at::empty({numel}, options);
    } else {
      received = at::empty({0}, options);
    }
    all_to_all_single(received, input, output_splits, input_splits, group);
    if (me != root) return;
    std::vector<int64_t> cursor(n, 0);
    for (int r = 1; r < n; ++r) cursor[r] = cursor[r - 1] + output_splits[r - 1];
    for (const auto& m : st.shards_metadata()) {
      pieces.push_back(received.narrow(0, cursor[m.placement], m.numel()));
      cursor[m.placement] += m.numel();
    }
  }
  if (!writer) return;
  const auto& metas = st.shards_metadata();
  bool rows = !p.shape.empty();
  for (const auto& m : metas) rows = rows && is_row_block(m, p.shape);
  if (p.shape.empty()) {  // 0-dim: one element, held as a [1] shard
    for (const auto& piece : pieces) writer->write(piece, what);
    return;
  }
  if (rows) {
    // Row blocks tile the tensor: in offset order they are the tensor's bytes in file order.
    std::vector<size_t> order(metas.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return metas[a].shard_offsets[0] < metas[b].shard_offsets[0]; });
    for (size_t i : order) writer->write(pieces[i], what);
    return;
  }
  // Other shapes of shard (never FSDP's): assemble the whole tensor first.
  at::Tensor whole = at::empty(p.shape, options);
  for (size_t i = 0; i < metas.size(); ++i) {
    at::Tensor region = whole;
    for (size_t d = 0; d < metas[i].shard_offsets.size(); ++d)
      region = region.narrow(static_cast<int64_t>(d), metas[i].shard_offsets[d], metas[i].shard_sizes[d]);
    region.copy_(pieces[i].view(metas[i].shard_sizes));
  }
  writer->write(whole, what);
}

int64_t bytes_of(const PlannedEntry& p) {
  return std::accumulate(p.shape.begin(), p.shape.end(), int64_t{1}, std::multiplies<>()) *
         static_cast<int64_t>(c10::elementSize(p.dtype));
}

// Rank 0: which file each entry goes to, at most `max_bytes` of tensors per file (0: one file).
int assign_files(std::vector<PlannedEntry>& plan, int64_t max_bytes) {
  int file = 0;
  int64_t in_file = 0;
  for (auto& p : plan) {
    const int64_t bytes = bytes_of(p);
    if (max_bytes > 0 && in_file > 0 && in_file + bytes > max_bytes) {
      ++file;
      in_file = 0;
    }
    p.file = file;
    in_file += bytes;
  }
  return file + 1;
}

// Rank 0's files for `plan` (`n` of them): final and temporary paths, and each one's header.
void lay_out_files(Writer& writer, const std::vector<PlannedEntry>& plan, int n, const ExportTarget& target) {
  std::map<std::string, std::string> meta = target.metadata;
  meta.emplace("format", "pt");
  for (int i = 0; i < n; ++i) {
    std::vector<TensorSpec> specs;
    for (const auto& p : plan)
      if (p.file == i) specs.push_back({p.key, dtype_name(p.dtype), p.shape});
    writer.files.push_back(target.file_name(i, n));
    writer.tmps.push_back(writer.files.back() + ".tmp-" + std::to_string(::getpid()));
    writer.prefixes.push_back(layout_safetensors(specs, meta).prefix);
  }
}

// Step 1, rank 0: the plan, the files' headers and the first file created (into `writer`); the
// plan as text for every rank, or rank 0's error, with nothing left on disk.
std::string plan_and_open(const StateDict& sd, const ExportTarget& target, std::unique_ptr<Writer>& writer) {
  try {
    if (target.where.empty()) throw Error("the file name is empty");
    std::vector<PlannedEntry> plan = make_plan(sd, target);
    const int n = assign_files(plan, target.max_file_bytes);
    writer = std::make_unique<Writer>();
    writer->cast = target.dtype;
    lay_out_files(*writer, plan, n, target);
    writer->enter(0);
    if (!writer->error.empty()) throw Error(writer->error);
    return json({{"plan", plan_to_json(plan)}}).dump();
  } catch (const std::exception& e) {
    if (writer) writer->remove_all();
    writer.reset();
    return json({{"error", without_prefix(e.what())}}).dump();
  }
}

// Step 2: every rank checks its own dict against the plan, and every rank's error goes to every
// rank, so all throw or none (rank 0 first removing its files).
void agree_on_plan(const Comm& comm, const StateDict& sd, const std::vector<PlannedEntry>& plan,
                   const ExportTarget& target, Writer* writer, const std::string& failed) {
  std::string mine;
  try {
    mine = check_against_plan(sd, plan, comm.rank, target.dtype);
  } catch (const std::exception& e) {
    mine = without_prefix(e.what());
  }
  std::string errors;
  const auto all = comm.all_gather(mine);
  for (int r = 0; r < comm.size; ++r)
    if (!all[r].empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + all[r];
  if (!errors.empty()) {
    if (writer) writer->remove_all();
    throw Error(failed + errors);
  }
}

// Step 3: one tensor at a time, file after file; `writer` is rank 0's (null elsewhere).
void stream_entries(const StateDict& sd, const std::vector<PlannedEntry>& plan, int rank, Writer* writer) {
  for (const auto& p : plan) {
    if (writer) writer->enter(p.file);
    if (!p.sharded) {
      if (writer) writer->write(sd.at(p.key).tensor().detach(), "tensor '" + p.key + "'");
      continue;
    }
    if (!contains(p.group, rank)) continue;
    stream_sharded(sd.at(p.key).sharded_tensor(), p, rank, writer);
  }
}

// Rank 0's written files synced and renamed into place, then reported to `target`; throws on
// the first failure.
void install_files(Writer& writer, const std::vector<PlannedEntry>& plan, const ExportTarget& target) {
  writer.out.sync();
  writer.out = File();  // closed
  if (target.before_rename) target.before_rename(writer.files);
  for (size_t i = 0; i < writer.files.size(); ++i)
    if (::rename(writer.tmps[i].c_str(), writer.files[i].c_str()) != 0)
      throw Error("cannot rename " + writer.tmps[i] + " to " + writer.files[i] + ": " + std::strerror(errno));
  const std::string parent = std::filesystem::path(writer.files[0]).parent_path().string();
  fsync_dir(parent.empty() ? "." : parent);
  if (target.after_commit) {
    ExportedFiles done;
    done.files = writer.files;
    for (const auto& p : plan) {
      done.file_of[p.key] = std::filesystem::path(writer.files[p.file]).filename().string();
      done.total_bytes += bytes_of(p);
    }
    target.after_commit(done);
  }
}

// Step 4, rank 0: the files installed, or removed after any error; the outcome for every rank
// ("" when the export succeeded).
std::string commit(Writer& writer, const std::vector<PlannedEntry>& plan, const ExportTarget& target,
                   const std::string& failed) {
  if (writer.error.empty()) {
    try {
      install_files(writer, plan, target);
    } catch (const std::exception& e) {
      writer.error = without_prefix(e.what());
    }
  }
  if (writer.error.empty()) return "";
  writer.remove_all();
  std::string outcome = failed + "rank 0: " + writer.error;
  if (target.max_file_bytes == 0) outcome += " (a file already at " + target.where + ", if any, is untouched)";
  return outcome;
}

}  // namespace

void detail::export_files(const StateDict& sd, const ExportTarget& target) {
  at::NoGradGuard no_grad;
  const Comm comm = Comm::of({}, target.api.c_str());
  const int rank = comm.rank;  // the default group's rank is the global rank
  const std::string failed = target.api + " to " + target.where + " failed: ";

  std::unique_ptr<Writer> writer;
  std::string plan_text;
  if (rank == 0) plan_text = plan_and_open(sd, target, writer);
  comm.broadcast(plan_text);
  const json planned = json::parse(plan_text);
  if (planned.contains("error")) throw Error(failed + "rank 0: " + planned["error"].get<std::string>());
  const std::vector<PlannedEntry> plan = plan_from_json(planned.at("plan"));

  agree_on_plan(comm, sd, plan, target, writer.get(), failed);
  stream_entries(sd, plan, rank, writer.get());
  std::string outcome = writer ? commit(*writer, plan, target, failed) : "";
  comm.broadcast(outcome);
  if (!outcome.empty()) throw Error(outcome);
}

StateDict detail::shared_state_dict(torch::nn::Module& model, std::map<std::string, std::string>* aliases) {
  StateDict sd;
  at::NoGradGuard no_grad;
  const ModelLayout layout(model);
  std::map<const c10::TensorImpl*, std::string> first_key;
  for (const auto& e : layout.entries) {
    const auto [first, added] = first_key.emplace(e.tensor.unsafeGetTensorImpl(), e.key);
    if (aliases && !added) aliases->emplace(e.key, first->second);
    if (e.layout)
      sd.insert(e.key, e.layout->to_sharded_tensor((e.sharded ? e.sharded->local_shard : e.tensor).detach(),
                                                   /*copy=*/false));
    else
      sd.insert(e.key, e.tensor.detach());
  }
  return sd;
}

namespace {

ExportTarget one_file(const std::string& file, const std::map<std::string, std::string>& metadata) {
  ExportTarget t;
  t.api = kApi;
  t.where = file;
  t.file_name = [file](int, int) { return file; };
  t.metadata = metadata;
  return t;
}

}  // namespace

void export_safetensors(const StateDict& sd, const std::string& file, const std::map<std::string, std::string>& metadata) {
  export_files(sd, one_file(file, metadata));
}

void export_safetensors(torch::nn::Module& model, const std::string& file,
                        const std::map<std::string, std::string>& metadata) {
  export_files(shared_state_dict(model), one_file(file, metadata));
}

}  // namespace fsdpp::checkpoint

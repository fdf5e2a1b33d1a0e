// Streamed full export: a model's full state dict to one standard safetensors file, written by
// rank 0 while each sharded tensor is gathered to it one at a time (issue 14).
//
// 1. Plan (rank 0): the file's header follows from rank 0's keys, dtypes and global shapes
//    alone; rank 0 writes it to FILE.tmp-<pid> and sends the plan (per entry: whole or sharded,
//    dtype, shape, the sharding group's ranks) to every rank.
// 2. Agree: each rank checks its own dict against the plan; every rank's error goes to every
//    rank (the pattern of checkpoint::save), so all throw or none.
// 3. Stream: per entry in order, rank 0 writes a whole tensor from its dict; a ShardedTensor
//    whose group holds rank 0 is gathered to rank 0 by one all_to_all_single in which only rank
//    0 receives (each other rank sends its rows once; ranks outside that group skip), written
//    at its place and freed. A failed write stops the writing but not the gathering, so the
//    other ranks never wait on rank 0.
// 4. Commit: rank 0 fsyncs and renames the file into place (or removes it); its outcome goes
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
};

json plan_to_json(const std::vector<PlannedEntry>& plan) {
  json out = json::array();
  for (const auto& e : plan)
    out.push_back({{"key", e.key}, {"sharded", e.sharded}, {"dtype", static_cast<int>(e.dtype)},
                   {"shape", e.shape}, {"group", e.group}});
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
    plan.push_back(std::move(p));
  }
  return plan;
}

std::vector<PlannedEntry> make_plan(const StateDict& sd) {
  std::vector<PlannedEntry> plan;
  for (const auto& [key, value] : sd) {
    PlannedEntry p;
    p.key = key;
    p.sharded = value.is_sharded();
    p.dtype = value.dtype();
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
std::string check_against_plan(const StateDict& sd, const std::vector<PlannedEntry>& plan, int rank) {
  for (const auto& p : plan) {
    if (!p.sharded || !contains(p.group, rank)) continue;
    const StateDictValue* v = sd.find(p.key);
    if (!v) return "its state dict has no '" + p.key + "', which rank 0 holds as a ShardedTensor";
    if (!v->is_sharded()) return "'" + p.key + "' is a whole tensor here but a ShardedTensor on rank 0";
    if (v->dtype() != p.dtype || v->sizes() != p.shape)
      return "'" + p.key + "' is " + c10::toString(v->dtype()) + " " + shape_string(v->sizes()) + " here but " +
             c10::toString(p.dtype) + " " + shape_string(p.shape) + " on rank 0";
    if (ranks_of(v->sharded_tensor().process_group()) != p.group)
      return "'" + p.key + "' is sharded over another group here than on rank 0";
  }
  return "";
}

// Rank 0's part of the file: the open temporary file and the first write error, after which
// nothing more is written (but every gather still runs, so no other rank waits on rank 0).
struct Writer {
  std::string file, tmp;
  File out;
  std::string error;

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
    at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(at::kCPU).contiguous();
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

void export_state_dict(const StateDict& sd, const std::string& file, const std::map<std::string, std::string>& metadata) {
  at::NoGradGuard no_grad;
  const Comm comm = Comm::of({}, kApi);
  const int rank = comm.rank;  // the default group's rank is the global rank
  const std::string failed = std::string(kApi) + " to " + file + " failed: ";

  // 1. Plan and header (rank 0).
  std::unique_ptr<Writer> writer;
  std::string plan_text;
  if (rank == 0) {
    try {
      if (file.empty()) throw Error("the file name is empty");
      const std::vector<PlannedEntry> plan = make_plan(sd);
      std::vector<TensorSpec> specs;
      for (const auto& p : plan) specs.push_back({p.key, dtype_name(p.dtype), p.shape});
      std::map<std::string, std::string> meta = metadata;
      meta.emplace("format", "pt");
      const SafetensorsLayout layout = layout_safetensors(specs, meta);
      writer = std::make_unique<Writer>();
      writer->file = file;
      writer->tmp = file + ".tmp-" + std::to_string(::getpid());
      writer->out = File::create(writer->tmp);
      writer->write(layout.prefix.data(), static_cast<int64_t>(layout.prefix.size()), "the safetensors header");
      if (!writer->error.empty()) throw Error(writer->error);
      plan_text = json({{"plan", plan_to_json(plan)}}).dump();
    } catch (const std::exception& e) {
      if (writer) std::remove(writer->tmp.c_str());
      writer.reset();
      plan_text = json({{"error", without_prefix(e.what())}}).dump();
    }
  }
  comm.broadcast(plan_text);
  const json planned = json::parse(plan_text);
  if (planned.contains("error")) throw Error(failed + "rank 0: " + planned["error"].get<std::string>());
  const std::vector<PlannedEntry> plan = plan_from_json(planned.at("plan"));

  // 2. Agree that every rank's dict fits the plan.
  std::string mine;
  try {
    mine = check_against_plan(sd, plan, rank);
  } catch (const std::exception& e) {
    mine = without_prefix(e.what());
  }
  std::string errors;
  const auto all = comm.all_gather(mine);
  for (int r = 0; r < comm.size; ++r)
    if (!all[r].empty()) errors += (errors.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + all[r];
  if (!errors.empty()) {
    if (writer) std::remove(writer->tmp.c_str());
    throw Error(failed + errors);
  }

  // 3. Stream, one tensor at a time.
  for (const auto& p : plan) {
    if (!p.sharded) {
      if (writer) writer->write(sd.at(p.key).tensor().detach(), "tensor '" + p.key + "'");
      continue;
    }
    if (!contains(p.group, rank)) continue;
    stream_sharded(sd.at(p.key).sharded_tensor(), p, rank, writer.get());
  }

  // 4. Commit (rank 0) and tell every rank.
  std::string outcome;
  if (writer) {
    if (writer->error.empty()) {
      try {
        writer->out.sync();
        writer->out = File();  // closed
        if (::rename(writer->tmp.c_str(), file.c_str()) != 0)
          throw Error("cannot rename " + writer->tmp + " to " + file + ": " + std::strerror(errno));
        const std::string parent = std::filesystem::path(file).parent_path().string();
        fsync_dir(parent.empty() ? "." : parent);
      } catch (const std::exception& e) {
        writer->error = without_prefix(e.what());
      }
    }
    if (!writer->error.empty()) {
      std::remove(writer->tmp.c_str());
      outcome = failed + "rank 0: " + writer->error + " (a file already at " + file + ", if any, is untouched)";
    }
  }
  comm.broadcast(outcome);
  if (!outcome.empty()) throw Error(outcome);
}

}  // namespace

void export_safetensors(const StateDict& sd, const std::string& file, const std::map<std::string, std::string>& metadata) {
  export_state_dict(sd, file, metadata);
}

void export_safetensors(torch::nn::Module& model, const std::string& file,
                        const std::map<std::string, std::string>& metadata) {
  // The SHARDED state dict without copies: each sharded parameter's part (FSDP's shard, a TP
  // part, or a 2-D block) as a ShardedTensor view, every other entry the module's own tensor
  // (get_model_state_dict would copy them all).
  StateDict sd;
  {
    at::NoGradGuard no_grad;
    const ModelLayout layout(model);
    for (const auto& e : layout.entries) {
      if (e.layout)
        sd.insert(e.key, e.layout->to_sharded_tensor((e.sharded ? e.sharded->local_shard : e.tensor).detach(),
                                                     /*copy=*/false));
      else
        sd.insert(e.key, e.tensor.detach());
    }
  }
  export_state_dict(sd, file, metadata);
}

}  // namespace fsdpp::checkpoint

#pragma once
// Distributed checkpoint, as torch.distributed.checkpoint: a directory with one safetensors data
// file per rank plus a metadata file written last. Any sharding saves; any other sharding (world
// size, process-group layout) loads, each rank reading only the byte ranges it needs.
// The on-disk format is specified in docs/checkpoint-format.md.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <fsdpp/process_group.h>

namespace torch::nn {
class Module;
template <typename Contained>
class ModuleHolder;
}  // namespace torch::nn

namespace fsdpp {
class StateDict;            // <fsdpp/state_dict_container.h>
struct OptimizerStateDict;  // <fsdpp/optimizer_state_dict.h>
}  // namespace fsdpp

namespace fsdpp::checkpoint {

// One local piece of a global tensor: `tensor` sits at `offsets` (one per dimension).
struct LocalShard {
  at::Tensor tensor;
  std::vector<int64_t> offsets;
};

// A value of a checkpoint's state: a tensor every rank holds whole, a sharded tensor (this
// rank's shards plus the global shape), or a plain value (step counter, learning rate, RNG state).
// On load, tensors are filled in place (an Entry shares the caller's tensor) and plain values
// are replaced.
class Entry {
 public:
  enum class Kind { kTensor, kSharded, kInt, kDouble, kString, kBytes };

  Entry() : Entry(int64_t{0}) {}
  // A whole tensor. When several ranks save the same key it must be the same on each (it is
  // replicated) and is written once.
  Entry(at::Tensor tensor);  // NOLINT: implicit, so a State reads like a state dict
  Entry(int64_t value);      // NOLINT
  Entry(int value) : Entry(int64_t{value}) {}  // NOLINT
  Entry(double value);       // NOLINT
  Entry(std::string value);  // NOLINT
  Entry(const char* value) : Entry(std::string(value)) {}  // NOLINT
  // This rank's shards of a tensor of `global_shape` (none, one or several; a shard may be empty).
  static Entry sharded(std::vector<int64_t> global_shape, std::vector<LocalShard> shards);
  static Entry sharded(at::Tensor local, std::vector<int64_t> offsets, std::vector<int64_t> global_shape);
  // Raw bytes (e.g. a generator's get_state()), kept apart from text.
  static Entry bytes(std::string value);

  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::kTensor || kind_ == Kind::kSharded; }
  const at::Tensor& tensor() const;               // kTensor
  const std::vector<LocalShard>& shards() const;  // kSharded
  const std::vector<int64_t>& global_shape() const;  // kTensor (its sizes) or kSharded
  int64_t to_int() const;
  double to_double() const;
  const std::string& to_string() const;  // kString or kBytes

 private:
  Kind kind_ = Kind::kInt;
  at::Tensor tensor_;
  std::vector<LocalShard> shards_;
  std::vector<int64_t> global_shape_;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
};

const char* to_string(Entry::Kind kind);

// Names to entries. Keys are free-form ("model.fc1.weight", "optim.state.0.exp_avg", "step").
using State = std::map<std::string, Entry>;

// Any object's state in a checkpoint, as torch.distributed.checkpoint.stateful.Stateful: a data
// loader's position, an RNG, a schedule. state_dict() is asked at save time and gives entries
// (tensors or plain values); after a load, load_state_dict() is handed what was read.
class Stateful {
 public:
  virtual ~Stateful() = default;
  virtual State state_dict() const = 0;
  virtual void load_state_dict(const State& state) = 0;
};

// `object`'s entries under `prefix` (each key prefix + key), to merge into the State to save or
// to load: to_state(loader, "loader.").
State to_state(const Stateful& object, const std::string& prefix);
// Hands `object` the entries of `state` under `prefix` (the prefix stripped) once a load filled
// them. Throws naming the prefix when the state holds none of them.
void load_stateful(Stateful& object, const State& state, const std::string& prefix);

struct SaveOptions {
  // The ranks saving together; every member calls save. Default: the default group if
  // init_process_group ran, else this process alone.
  TORCH_ARG(ProcessGroup, process_group);
};

struct LoadOptions {
  // Check each chunk read against its checksum (the whole chunk is read then). Off: read only
  // the dim-0 rows of a chunk that overlap the destination.
  TORCH_ARG(bool, verify) = true;
  // Copy each tensor into its destination as soon as it is read and checked, so the load holds
  // one tensor's read buffers beyond the state instead of every tensor's. A failed load may then
  // leave the entries before the failure changed: for a state with nothing to lose (a model just
  // given memory by to_empty, a fresh optimizer's), where memory is tight.
  TORCH_ARG(bool, in_place) = false;
};

// Collective over the group. Tensors must be on the CPU (or are copied there). Writes into
// DIR.tmp-<id>, then moves it to DIR atomically, replacing a previous checkpoint at DIR only
// once the new one is complete. Every rank returns or every rank throws.
void save(const State& state, const std::string& dir, const SaveOptions& options = {});

// What async_save returns: wait() blocks until the checkpoint is complete (or throws its error).
class SaveHandle {
 public:
  SaveHandle() = default;
  void wait();
  bool done() const;
  struct Impl;
  explicit SaveHandle(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

// Collective: stages every tensor to CPU memory and agrees on the plan now, then writes on a
// background thread while the caller trains on. A later save or async_save first waits for it.
SaveHandle async_save(const State& state, const std::string& dir, const SaveOptions& options = {});

// Not collective: reads what this rank's entries need. Entries must name saved keys with the
// saved dtype and global shape. On any error nothing in `state` has changed.
void load(State& state, const std::string& dir, const LoadOptions& options = {});

// State dicts (<fsdpp/state_dict.h>): each whole tensor and ShardedTensor (its local shards
// with their offsets) becomes an entry named prefix + key that shares the dict's tensors, so
// loading the State fills the dict in place. Combine several under prefixes:
//   State s = to_state(model_sd, "model."); s.merge(to_state(optim_sd, "optim.")); s["step"] = 10;
State to_state(const StateDict& sd, const std::string& prefix = "");
void save(const StateDict& sd, const std::string& dir, const SaveOptions& options = {});
// Fills sd's tensors in place (then hand sd to load_state_dict / set_model_state_dict).
void load(StateDict& sd, const std::string& dir, const LoadOptions& options = {});

// Optimizer state dicts (<fsdpp/optimizer_state_dict.h>) as entries: prefix + "state.<param>.<name>"
// (tensors as in the dict: whole or the rank's rows), prefix + "param_groups.<g>.params" (the
// parameter keys joined by '\n') and prefix + "param_groups.<g>.options" (bytes: libtorch's
// serialization of the group's options).
State to_state(const OptimizerStateDict& osd, const std::string& prefix);
struct Metadata;
// The optimizer state dict to load what to_state(osd, prefix) saved into, for a fresh optimizer
// (which has no state yet): for each parameter of `model_sd` (the model's SHARDED or FULL state
// dict), every state entry the checkpoint records for it, allocated and sharded like the
// parameter (whole when shaped otherwise, e.g. "step"), and the param groups as saved. Fill it
// with load(to_state(result, prefix), ...), then hand it to set_optimizer_state_dict.
OptimizerStateDict optim_state_dict_to_load(const Metadata& metadata, const StateDict& model_sd,
                                            const std::string& prefix);

// The metadata file, parsed (see docs/checkpoint-format.md).
struct ChunkInfo {
  std::vector<int64_t> offsets, sizes;
  std::string file;  // relative to the checkpoint directory
  std::string name;  // the tensor's name inside that safetensors file
  int64_t begin = 0, end = 0;  // absolute byte range in the file
  std::string xxh3_64;         // 16 lowercase hex digits, or empty when not recorded
};
struct EntryInfo {
  Entry::Kind kind = Entry::Kind::kTensor;  // kTensor for every tensor entry
  std::string dtype;                        // safetensors name: F32, BF16, I64, ...
  std::vector<int64_t> shape;
  std::vector<ChunkInfo> chunks;
  Entry value;  // plain values
};
struct Metadata {
  int world_size = 1;
  std::vector<std::string> files;
  std::map<std::string, int64_t> file_sizes;
  std::map<std::string, EntryInfo> entries;
};
Metadata read_metadata(const std::string& dir);

// fsdpp-ckpt's commands as functions.
std::string inspect(const std::string& dir);
// Every problem found (bad checksum, truncated or missing file, header mismatch); empty when sound.
std::vector<std::string> verify(const std::string& dir);
// One standard safetensors file with every tensor whole; plain values go to its __metadata__.
void consolidate(const std::string& dir, const std::string& safetensors_file);

// Plain safetensors files (as Python's safetensors and Hugging Face write them).
void save_safetensors(const std::map<std::string, at::Tensor>& tensors, const std::string& file,
                      const std::map<std::string, std::string>& metadata = {});
std::map<std::string, at::Tensor> load_safetensors(const std::string& file);
// Fills each tensor entry of `state` from the tensor of the same name, reading only the byte
// ranges its shards need (dim-0 rows); sharded entries load their slice of the full tensor.
void load_safetensors(State& state, const std::string& file);

// Streamed full export (a live model to one standard safetensors file, e.g. model.safetensors
// for Hugging Face). Collective over the default group (every rank of it calls; a process
// without a process group exports alone). Writes the model's full state dict: FULL keys and
// whole tensors, the same keys and values as get_model_state_dict(model, full_state_dict), in
// state-dict order and each entry's own dtype (bf16 parameters as BF16, int64 buffers as I64).
// Rank 0 alone writes; each FSDP-sharded tensor is gathered to it one at a time (only its
// shard group talks; HSDP replicas and ranks outside rank 0's shard group send nothing) and
// freed once written, so rank 0's memory peak above its state is one tensor (the largest
// sharded one), never the model. `metadata` goes to the file's __metadata__ (with
// "format": "pt" unless given). The file is written as FILE.tmp-<pid> and renamed into place:
// on any error no partial file is left, a file already at FILE is untouched, and every rank
// throws the same fsdpp::Error naming the file and the rank that failed.
void export_safetensors(torch::nn::Module& model, const std::string& file,
                        const std::map<std::string, std::string>& metadata = {});
template <class M>
void export_safetensors(const torch::nn::ModuleHolder<M>& model, const std::string& file,
                        const std::map<std::string, std::string>& metadata = {}) {
  export_safetensors(*model.ptr(), file, metadata);
}
// The same from a state dict (FULL, SHARDED or built by hand): whole tensors are written from
// rank 0's dict; each ShardedTensor is gathered to rank 0 over its process group, one at a
// time. Every rank passes its own dict of the same keys (rank 0's keys, dtypes and shapes
// decide; a rank whose ShardedTensor disagrees fails the export on every rank).
void export_safetensors(const StateDict& sd, const std::string& file,
                        const std::map<std::string, std::string>& metadata = {});

// Hugging Face model directories (what save_pretrained writes and from_pretrained reads):
// config.json, and model.safetensors or model.safetensors.index.json naming several shard files
// ("weight_map": tensor name -> file). Keys are the model's plain state-dict keys, so a model with
// Hugging Face's parameter names (fsdpp::LlamaForCausalLM) maps without renaming.

struct HuggingFaceLoadOptions {
  // A floating tensor saved in another floating dtype is converted (a bf16 file into float32
  // parameters); false: a dtype that differs is an error.
  TORCH_ARG(bool, convert_dtype) = true;
  // Each tensor is copied into the model as soon as it is read: the memory above the shards is
  // one tensor's rows instead of all this rank reads, but an error part-way leaves the model
  // partly loaded (as LoadOptions::in_place). Off: nothing changes until everything is read.
  TORCH_ARG(bool, in_place) = false;
};
struct HuggingFaceLoadReport {
  int64_t bytes_read = 0;  // tensor bytes this rank read (headers not counted)
  int64_t files = 0;       // safetensors files in the directory
  int64_t tensors = 0;     // tensors loaded
};
// Loads `dir`'s tensors into `model` (plain, FSDP, HSDP, tensor-parallel or both; deferred
// models after fsdpp::to_empty). Every rank of the model calls; no communication but
// ModelLayout's first look at a 2-D model, and each rank throws its own errors. Each rank reads
// only the dim-0 rows of each tensor that it holds (its FSDP shard: about 1/N of the data; a
// tensor-parallel column block: whole rows), from whichever files hold them. Refused, naming the
// key, file and shape, before the model changes: a tensor the model has and the directory lacks
// (a tied weight is read under either of its names), a tensor the directory has and the model
// lacks (but *.rotary_emb.inv_freq, which transformers recomputes too), a shape that differs, a
// shard file the index names that is absent, an index that names a tensor its file lacks.
HuggingFaceLoadReport load_huggingface(torch::nn::Module& model, const std::string& dir,
                                       const HuggingFaceLoadOptions& options = {});

struct HuggingFaceExportOptions {
  // Tensor bytes per shard file (save_pretrained's max_shard_size; its default "5GB"). A tensor
  // larger than this gets a file of its own.
  TORCH_ARG(int64_t, max_shard_size) = 5'000'000'000;
  // Floating tensors are written in this dtype (unset: each in its own).
  TORCH_ARG(std::optional<at::ScalarType>, dtype);
  // Written to DIR/config.json when not empty (fsdpp::LlamaConfig::to_json()).
  TORCH_ARG(std::string, config_json);
};
// Streams `model`'s full state dict into `dir` (made if absent) as export_safetensors does: rank
// 0 writes while each sharded tensor is gathered to it one at a time, so its memory above its
// state is one tensor, never a shard file or the model. One file model.safetensors, or, when the
// tensors exceed max_shard_size, model-00001-of-0000N.safetensors ... and
// model.safetensors.index.json (as save_pretrained). A tied weight is written once, under its
// first key (model.embed_tokens.weight, not lm_head.weight). The files are written as
// temporaries; an earlier export's index and the model*.safetensors files the new ones do not
// replace are then removed, the new files renamed into place, and the index and config.json
// written (docs/api.md says what a failure leaves). Collective over the default group; every
// rank throws the same fsdpp::Error on failure.
void export_huggingface(torch::nn::Module& model, const std::string& dir, const HuggingFaceExportOptions& options = {});

}  // namespace fsdpp::checkpoint

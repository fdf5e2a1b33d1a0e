#pragma once
// fsdpp::ModelLayout: a model's parameters and buffers under their plain keys (the keys of the
// unwrapped model: no `_fsdp_wrapped_module.` or `_checkpoint_wrapped_module.` segment), each
// with the global TensorLayout its value lies over: which group, and which block of the tensor
// each rank of it holds. It is the one place that composes FSDP's, HSDP's and tensor
// parallelism's placements; state dicts, clip_grad_norm_ and export_safetensors read it.
//
//   const fsdpp::ModelLayout layout(*model);
//   for (const auto& e : layout.entries)
//     if (e.layout) e.layout->process_group();  // the ranks whose parts make e's value
//
// A parameter lies over:
//   FSDP (and HSDP)           its unit's shard group, Shard(0) (ShardedParameter::layout); under
//                             HSDP each replica holds the same blocks over its own shard group;
//   tensor parallel Shard(d)  its TP group (TensorParallelParameter::layout);
//   both (2-D FSDP x TP)      the group of the (dp, tp) mesh's ranks, as the block each of them
//                             holds: the TP Shard over tp, then FSDP's Shard(0) of each TP-local
//                             part over dp (placements {FSDP's, TP's}, TensorLayout::blocks());
//   otherwise                 nothing: whole on every rank (buffers, plain and ignored
//                             parameters, a TP Replicate parameter without FSDP).
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <fsdpp/fully_shard.h>
#include <fsdpp/tensor_layout.h>

namespace fsdpp {

struct ModelLayout {
  // A parameter or buffer under its plain key. A parameter registered under several keys (tied)
  // has an entry for each.
  struct Entry {
    std::string key;
    at::Tensor tensor;  // the module's own tensor (for an FSDP parameter: its shard at rest)
    bool is_buffer = false;
    // Set when an FSDP unit shards it, with that unit.
    std::optional<ShardedParameter> sharded;
    FSDPModule* unit = nullptr;
    // Set for a tensor-parallel parameter: its global shape and placement over the TP group. An
    // FSDP unit then shards (and gathers) the TP-local part, whose shape is this layout's local one.
    std::optional<TensorLayout> tp_layout;
    // How its value lies over the ranks (the table above); unset: whole on every rank.
    std::optional<TensorLayout> layout;
  };
  // An FSDP unit that shards parameters, with the key of its LOCAL flat parameter
  // ("<plain path>._flat_param").
  struct Unit {
    std::string flat_key;
    FSDPModule* unit = nullptr;
    size_t first_entry = 0;  // entries before this one come before the unit in module order
  };

  // Reads the model through FSDPModule::sharded_parameters() and tensor_parallel_parameters().
  // Collective the first time a 2-D model's (dp, tp) pair of groups is seen in this process (an
  // all-gather over dp to learn which rank holds which block, then the group of the mesh's
  // ranks); no communication after. Every rank of the model builds it alike. Throws
  // fsdpp::Error naming the parameter when its two groups span no mesh.
  explicit ModelLayout(torch::nn::Module& model);

  std::vector<Entry> entries;  // module order: a module's parameters, buffers, children
  std::vector<Unit> units;     // units with parameters, module order
};

}  // namespace fsdpp

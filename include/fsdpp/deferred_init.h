#pragma once
// Deferred initialization: build a model of any size without allocating it, wrap it, and let
// each rank allocate and initialize only what it holds (docs/api.md, "Deferred initialization").
//
//   auto model = fsdpp::deferred_init([&] { return Transformer(args); });  // meta tensors only
//   fsdpp::fully_shard(model, options);                    // shards take their memory here
//   fsdpp::materialize_module(*model);                     // unit by unit: init, keep own rows
//
// Initialization is replayed per module: each module with deferred tensors is initialized by
// `param_init_fn` or, failing that, by the libtorch module's own reset_parameters(), with the
// default CPU generator seeded from (seed, the module's name). The values are therefore the
// same whatever the world size, the mesh or the wrapping, and equal to those of the plain model
// built the same way and materialized on one process (not to an eagerly built one).
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <torch/arg.h>
#include <torch/nn/module.h>

namespace fsdpp {
namespace compat {
class MetaDeviceScope;
}

// While alive on this thread, every tensor created (factories and ops alike) is on the meta
// device: shapes and dtypes, no memory. C++'s `with torch.device("meta"):`.
class MetaDeviceGuard {
 public:
  MetaDeviceGuard();
  ~MetaDeviceGuard();
  MetaDeviceGuard(const MetaDeviceGuard&) = delete;
  MetaDeviceGuard& operator=(const MetaDeviceGuard&) = delete;

 private:
  std::unique_ptr<compat::MetaDeviceScope> scope_;
};

// Returns build()'s result, built under a MetaDeviceGuard (torchdistx's deferred_init).
template <typename Build>
auto deferred_init(Build&& build) {
  MetaDeviceGuard guard;
  return std::forward<Build>(build)();
}

// FSDP1's param_init_fn: initializes `module`'s own parameters and buffers (not its children's),
// which hold their full shapes when it is called, and returns true; false leaves the module to
// the defaults. Runs without gradient recording.
using ParamInitFn = std::function<bool(torch::nn::Module& module)>;

struct MaterializeOptions {
  // Mixed with each module's name into the generator's seed.
  TORCH_ARG(uint64_t, seed) = 0;
  TORCH_ARG(ParamInitFn, param_init_fn) = nullptr;
};

// Allocates and initializes every deferred parameter and buffer of `model`. An FSDP unit is
// allocated whole in host memory on this rank, initialized, and cut to this rank's rows before
// the next unit: the peak is the shards plus one unit, and no collective runs. Values are drawn
// on the host; the shards, and the buffers of the modules a unit holds, then live on the unit's
// compute device (FullyShardOptions::device_id, e.g. a GPU), tensors outside units on the CPU. A module with deferred
// tensors that neither param_init_fn nor a libtorch reset_parameters() initializes is an error
// naming it (checked for every module before any is touched when param_init_fn is unset).
// Defaults cover Linear, Bilinear, Embedding, EmbeddingBag, LayerNorm, GroupNorm, Conv1d-3d,
// ConvTranspose1d-3d and BatchNorm1d-3d / InstanceNorm1d-3d.
void materialize_module(torch::nn::Module& model, const MaterializeOptions& options = {});

// Module::to_empty: gives every deferred tensor memory without initializing it, for a checkpoint
// or state dict load to fill (an FSDP unit's shards: only this rank's rows), on the device
// materialize_module would put it on.
void to_empty(torch::nn::Module& model);

// Whether any parameter or buffer of `model` still waits for materialize_module or to_empty.
bool has_deferred_tensors(const torch::nn::Module& model);

}  // namespace fsdpp

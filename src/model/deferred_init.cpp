// Deferred initialization: modules built on the meta device, then each module's tensors given
// memory and initialized one module (under FSDP: one unit) at a time.
#include <fsdpp/deferred_init.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/instancenorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>

#include "compat/meta_device.h"
#include "model/plain_key.h"

namespace fsdpp {

MetaDeviceGuard::MetaDeviceGuard() : scope_(std::make_unique<compat::MetaDeviceScope>()) {}
MetaDeviceGuard::~MetaDeviceGuard() = default;

namespace {

// A module of the user's model under the name it has without fsdpp's wrappers, so that the
// seed, and with it the values, do not depend on the wrapping; and the device its tensors are
// computed with: the compute device of the innermost unit around it (FullyShardOptions'
// device_id), else the CPU.
struct NamedModule {
  std::string name;
  torch::nn::Module* module;
  at::Device home;
};

void walk(torch::nn::Module& m, const std::string& name, at::Device home, std::vector<NamedModule>& out) {
  if (const auto* unit = dynamic_cast<const FSDPModule*>(&m)) home = unit->compute_device();
  out.push_back({name, &m, home});
  for (const auto& child : m.named_children()) walk(*child.value(), detail::plain_name(name, child.key()), home, out);
}

std::vector<NamedModule> modules_of(torch::nn::Module& model) {
  std::vector<NamedModule> out;
  walk(model, "", at::kCPU, out);
  return out;
}

std::string display(const std::string& name) { return name.empty() ? "(the root)" : "'" + name + "'"; }

// The direct parameters and buffers of a module.
std::vector<std::pair<std::string, at::Tensor>> own_tensors(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters(/*recurse=*/false)) out.emplace_back(p.key(), p.value());
  for (const auto& b : m.named_buffers(/*recurse=*/false)) out.emplace_back(b.key(), b.value());
  return out;
}

// Each parameter of a unit still waiting for its values, and its unit.
std::unordered_map<const c10::TensorImpl*, FSDPModule*> deferred_unit_params(const std::vector<NamedModule>& modules) {
  std::unordered_map<const c10::TensorImpl*, FSDPModule*> out;
  for (const auto& nm : modules)
    if (auto* unit = dynamic_cast<FSDPModule*>(nm.module); unit && unit->has_deferred_parameters())
      for (const auto& p : unit->sharded_parameters()) out.emplace(p.param.unsafeGetTensorImpl(), unit);
  return out;
}

// A module with tensors to materialize: its meta ones, and the unit holding its deferred shards.
struct Pending {
  NamedModule at;
  std::vector<std::string> tensor_names;
  FSDPModule* unit = nullptr;
};

std::vector<Pending> pending_modules(const std::vector<NamedModule>& modules) {
  const auto unit_params = deferred_unit_params(modules);
  std::unordered_set<const c10::TensorImpl*> seen;  // a tied tensor belongs to its first module
  std::vector<Pending> out;
  for (const auto& nm : modules) {
    Pending p{nm, {}, nullptr};
    for (const auto& [name, t] : own_tensors(*nm.module)) {
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
      auto it = unit_params.find(t.unsafeGetTensorImpl());
      if (it == unit_params.end() && !t.is_meta()) continue;
      if (it != unit_params.end()) p.unit = it->second;
      p.tensor_names.push_back(name);
    }
    if (!p.tensor_names.empty()) out.push_back(std::move(p));
  }
  return out;
}

template <typename Impl>
bool reset_if(torch::nn::Module& m, bool apply) {
  auto* typed = dynamic_cast<Impl*>(&m);
  if (typed && apply) typed->reset_parameters();
  return typed != nullptr;
}

template <typename... Impl>
bool reset_if_any(torch::nn::Module& m, bool apply) {
  return (reset_if<Impl>(m, apply) || ...);
}

// Whether `m` is a libtorch module whose reset_parameters() initializes all its own tensors;
// with `apply`, calls it.
bool libtorch_reset(torch::nn::Module& m, bool apply) {
  using namespace torch::nn;
  return reset_if_any<LinearImpl, BilinearImpl, EmbeddingImpl, EmbeddingBagImpl, LayerNormImpl, GroupNormImpl, Conv1dImpl,
                      Conv2dImpl, Conv3dImpl, ConvTranspose1dImpl, ConvTranspose2dImpl, ConvTranspose3dImpl,
                      BatchNorm1dImpl, BatchNorm2dImpl, BatchNorm3dImpl, InstanceNorm1dImpl, InstanceNorm2dImpl,
                      InstanceNorm3dImpl>(m, apply);
}

std::string no_init_error(const Pending& p) {
  std::string names;
  for (const auto& n : p.tensor_names) names += (names.empty() ? "'" : ", '") + n + "'";
  return "materialize_module: module " + display(p.at.name) + " (" + p.at.module->name() + ") has deferred tensors " +
         names + " that neither param_init_fn nor a libtorch reset_parameters() initializes; give a param_init_fn " +
         "that does, or build this module outside deferred_init";
}

// FNV-1a over the seed and the module's name: stable across builds and platforms.
uint64_t module_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](unsigned char c) { h = (h ^ c) * 1099511628211ULL; };
  for (int i = 0; i < 8; ++i) mix(static_cast<unsigned char>(seed >> (8 * i)));
  for (char c : name) mix(static_cast<unsigned char>(c));
  return h;
}

// Memory on `device` for the module's meta tensors (its unit's parameters are given theirs by
// the unit); returns them.
std::vector<at::Tensor> allocate_meta_tensors(torch::nn::Module& m, const at::Device& device) {
  std::vector<at::Tensor> allocated;
  for (const auto& [name, t] : own_tensors(m))
    if (t.defined() && t.is_meta()) {
      compat::give_meta_tensor_memory(t, device);
      allocated.push_back(t);
    }
  return allocated;
}

// The default CPU generator seeded for one module, and given back its state afterwards (also
// when the initializer throws).
class SeededGenerator {
 public:
  explicit SeededGenerator(uint64_t seed) : generator_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    saved_ = generator_.get_state();
    generator_.set_current_seed(seed);
  }
  ~SeededGenerator() {
    std::lock_guard<std::mutex> lock(generator_.mutex());
    generator_.set_state(saved_);
  }
  SeededGenerator(const SeededGenerator&) = delete;
  SeededGenerator& operator=(const SeededGenerator&) = delete;

 private:
  at::Generator generator_;
  at::Tensor saved_;
};

// On the host, where the seeded CPU generator draws every value whatever the compute device;
// the module's own tensors then move to it (a unit's parameters are written into its shards).
void initialize(const Pending& p, const MaterializeOptions& options) {
  const std::vector<at::Tensor> own = allocate_meta_tensors(*p.at.module, at::kCPU);
  SeededGenerator seeded(module_seed(options.seed(), p.at.name));
  at::NoGradGuard no_grad;
  const bool done =
      (options.param_init_fn() && options.param_init_fn()(*p.at.module)) || libtorch_reset(*p.at.module, /*apply=*/true);
  if (!done) throw Error(no_init_error(p));
  for (at::Tensor t : own)
    if (t.device() != p.at.home) t.set_data(t.to(p.at.home));
}

}  // namespace

void materialize_module(torch::nn::Module& model, const MaterializeOptions& options) {
  const auto pending = pending_modules(modules_of(model));
  if (!options.param_init_fn())
    for (const auto& p : pending)
      if (!libtorch_reset(*p.at.module, /*apply=*/false)) throw Error(no_init_error(p));
  // Modules outside units first, then unit by unit (in the order units are first met), so that
  // one unit at a time is whole.
  std::vector<FSDPModule*> units;
  for (const auto& p : pending) {
    if (!p.unit) initialize(p, options);
    else if (std::find(units.begin(), units.end(), p.unit) == units.end()) units.push_back(p.unit);
  }
  for (FSDPModule* unit : units)
    unit->materialize_parameters([&] {
      for (const auto& p : pending)
        if (p.unit == unit) initialize(p, options);
    });
}

void to_empty(torch::nn::Module& model) {
  const auto modules = modules_of(model);
  for (const auto& nm : modules) {
    allocate_meta_tensors(*nm.module, nm.home);
    if (auto* unit = dynamic_cast<FSDPModule*>(nm.module)) unit->mark_parameters_materialized();
  }
}

bool has_deferred_tensors(const torch::nn::Module& model) {
  auto& m = const_cast<torch::nn::Module&>(model);
  const auto modules = modules_of(m);
  if (!deferred_unit_params(modules).empty()) return true;
  for (const auto& nm : modules)
    for (const auto& [name, t] : own_tensors(*nm.module))
      if (t.defined() && t.is_meta()) return true;
  return false;
}

}  // namespace fsdpp

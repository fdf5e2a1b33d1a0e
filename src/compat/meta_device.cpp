#include "compat/meta_device.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <fsdpp/error.h>

namespace fsdpp::compat {
namespace {

uint64_t bits(c10::DispatchKeySet set) { return set.raw_repr(); }

}  // namespace

MetaDeviceScope::MetaDeviceScope() {
  c10::impl::LocalDispatchKeySet now = c10::impl::tls_local_dispatch_key_set();
  saved_included_ = bits(now.included_);
  saved_excluded_ = bits(now.excluded_);
  c10::impl::LocalDispatchKeySet meta = now;
  meta.included_ = meta.included_ | c10::DispatchKeySet(c10::DispatchKey::Meta);
  meta.excluded_ = meta.excluded_ | c10::DispatchKeySet(c10::DispatchKey::BackendSelect);
  c10::impl::_force_tls_local_dispatch_key_set(meta);
}

MetaDeviceScope::~MetaDeviceScope() {
  c10::impl::LocalDispatchKeySet saved = c10::impl::tls_local_dispatch_key_set();
  saved.included_ = c10::DispatchKeySet(c10::DispatchKeySet::RAW, saved_included_);
  saved.excluded_ = c10::DispatchKeySet(c10::DispatchKeySet::RAW, saved_excluded_);
  c10::impl::_force_tls_local_dispatch_key_set(saved);
}

void give_meta_tensor_data(const at::Tensor& meta, const at::Tensor& data) {
  if (!meta.is_meta() || data.is_meta() || meta.scalar_type() != data.scalar_type())
    throw Error(std::string("give_meta_tensor_data: a meta tensor takes real data of its dtype, not ") +
                c10::toString(data.scalar_type()) + " on " + data.device().str() + " for " +
                c10::toString(meta.scalar_type()) + " on " + meta.device().str());
  // What Tensor::set_data does after its type check: the data, sizes, device and dispatch keys
  // of `data`; the autograd metadata and version counter stay.
  meta.unsafeGetTensorImpl()->shallow_copy_from(data.getIntrusivePtr());
}

void give_meta_tensor_memory(const at::Tensor& meta, const at::Device& device) {
  give_meta_tensor_data(meta, at::empty(meta.sizes(), meta.options().device(device)));
}

}  // namespace fsdpp::compat

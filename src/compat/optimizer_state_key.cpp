#include "compat/optimizer_state_key.h"

#include <sstream>
#include <string>

namespace fsdpp::compat {
namespace {

template <typename Key>
Key key_of(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;  // as libtorch 1.13's c10::guts::to_string(impl)
    key << impl;
    return key.str();
  } else {
    return impl;
  }
}

}  // namespace

OptimizerStateKey optimizer_state_key(const at::Tensor& param) {
  return key_of<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

}  // namespace fsdpp::compat

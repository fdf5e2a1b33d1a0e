#include "model/plain_key.h"

namespace fsdpp::detail {

std::string plain_name(const std::string& parent, const std::string& segment) {
  if (segment == "_fsdp_wrapped_module" || segment == "_checkpoint_wrapped_module") return parent;
  return parent.empty() ? segment : parent + "." + segment;
}

}  // namespace fsdpp::detail

#include <fsdpp/mixed_precision_policy.h>

#include <fsdpp/error.h>

namespace fsdpp {

void MixedPrecisionPolicy::check(const std::string& unit) const {
  auto require_floating = [&](const std::optional<at::ScalarType>& dtype, const char* field) {
    if (dtype && !at::isFloatingType(*dtype))
      throw Error("fully_shard of " + unit + ": mp_policy " + field + " " + c10::toString(*dtype) +
                  " is not a floating-point dtype");
  };
  require_floating(param_dtype_, "param_dtype");
  require_floating(reduce_dtype_, "reduce_dtype");
  require_floating(output_dtype_, "output_dtype");
}

}  // namespace fsdpp

#include <fsdpp/wrap_policy.h>

namespace fsdpp {

std::shared_ptr<const AutoWrapPolicy> SizeBasedAutoWrapPolicy(int64_t min_num_params) {
  auto policy = std::make_shared<AutoWrapPolicy>();
  policy->should_wrap = [min_num_params](const torch::nn::Module&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
  return policy;
}

}  // namespace fsdpp

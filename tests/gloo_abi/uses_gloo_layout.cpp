// What check_gloo_abi.sh must refuse (GlooAbi.RefusesCodeThatUsesGlooLayout): a backend made as
// gloo_backend.cpp makes it, then ProcessGroupGloo's inline setTimeout, which walks the group's
// gloo::Context objects through Gloo's headers.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_and_set_timeout(const c10::intrusive_ptr<c10d::Store>& store) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(1000));
  auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
  group->setTimeout(std::chrono::milliseconds(2000));
  return group;
}

// What check_gloo_abi.sh must refuse (GlooAbi.RefusesCodeThatUsesGlooLayout): a backend made as
// gloo_backend.cpp makes it, plus a ProcessGroupGloo::GlooStore made here. GlooStore derives from
// gloo::rendezvous::Store and is defined inline in c10d's header, so its construction, virtual
// table and base-class layout come from whatever Gloo headers this was compiled against.
#include <memory>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_with_a_gloo_store(const c10::intrusive_ptr<c10d::Store>& store,
                                                                  std::shared_ptr<::gloo::rendezvous::Store>& out) {
  out = std::make_shared<c10d::ProcessGroupGloo::GlooStore>(store);
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(1000));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, options);
}

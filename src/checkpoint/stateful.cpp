#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>

namespace fsdpp::checkpoint {

State to_state(const Stateful& object, const std::string& prefix) {
  State out;
  for (auto& [key, entry] : object.state_dict()) out.emplace(prefix + key, entry);
  return out;
}

void load_stateful(Stateful& object, const State& state, const std::string& prefix) {
  State own;
  for (auto it = state.lower_bound(prefix); it != state.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    own.emplace(it->first.substr(prefix.size()), it->second);
  if (own.empty()) throw Error("load_stateful: the state holds no entry under '" + prefix + "'");
  object.load_state_dict(own);
}

}  // namespace fsdpp::checkpoint

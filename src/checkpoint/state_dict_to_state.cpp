// State dicts of <fsdpp/state_dict.h> as checkpoint state.
#include <fsdpp/checkpoint.h>
#include <fsdpp/error.h>
#include <fsdpp/state_dict.h>

namespace fsdpp::checkpoint {

State to_state(const StateDict& sd, const std::string& prefix) {
  State state;
  for (const auto& [key, value] : sd) {
    if (value.is_tensor()) {
      state.emplace(prefix + key, Entry(value.tensor()));
      continue;
    }
    const ShardedTensor& st = value.sharded_tensor();
    std::vector<LocalShard> shards;
    for (const auto& local : st.local_shards()) shards.push_back(LocalShard{local.tensor, local.metadata.shard_offsets});
    state.emplace(prefix + key, Entry::sharded(st.size(), std::move(shards)));
  }
  return state;
}

void save(const StateDict& sd, const std::string& dir, const SaveOptions& options) {
  save(to_state(sd), dir, options);
}

void load(StateDict& sd, const std::string& dir, const LoadOptions& options) {
  State state = to_state(sd);
  load(state, dir, options);
}

}  // namespace fsdpp::checkpoint

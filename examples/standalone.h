#pragma once
// Started without a launcher (no RANK and no WORLD_SIZE in the environment), an example runs as
// one rank, as a single-process PyTorch script does: a world of one meeting in a store of its own
// (nothing listens on a port). Under fsdpp-run or torchrun the environment's rendezvous is used,
// and so is Slurm's when srun starts the ranks itself.
#include <cstdio>
#include <cstdlib>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <fsdpp/process_group.h>
#include <fsdpp/slurm_environment.h>

namespace fsdpp::examples {

inline bool started_by_launcher() {
  use_slurm_environment();
  return std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
}

inline ProcessGroup init_process_group_or_single_rank(InitProcessGroupOptions options, const char* program) {
  if (!started_by_launcher()) {
    std::fprintf(stderr, "%s: not started by a launcher (RANK and WORLD_SIZE unset): running as one rank\n", program);
    options.store(c10::make_intrusive<c10d::HashStore>()).rank(0).world_size(1);
  }
  return init_process_group(options);
}

}  // namespace fsdpp::examples

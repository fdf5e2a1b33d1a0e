#include <fsdpp/slurm_environment.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include <fsdpp/error.h>

#include "common/slurm.h"

namespace fsdpp {
namespace {

const char* env(const char* name) { return std::getenv(name); }

int whole_number(const char* name) { return slurm::whole_number(name, env(name)); }

}  // namespace

bool use_slurm_environment() {
  if (env("RANK") || env("WORLD_SIZE")) return false;  // a launcher started us
  if (!(env("SLURM_STEP_ID") || env("SLURM_STEPID")) || !env("SLURM_PROCID") || !env("SLURM_NTASKS")) return false;
  auto set = [](const char* name, const std::string& value) { setenv(name, value.c_str(), 1); };
  try {
    const int node = env("SLURM_NODEID") ? whole_number("SLURM_NODEID") : 0;
    int local_world = 1;
    if (const char* per_node = env("SLURM_STEP_TASKS_PER_NODE") ? env("SLURM_STEP_TASKS_PER_NODE")
                                                                : env("SLURM_TASKS_PER_NODE")) {
      const auto tasks = slurm::tasks_per_node(per_node);
      if (node < static_cast<int>(tasks.size())) local_world = tasks[static_cast<size_t>(node)];
    }
    set("RANK", std::to_string(whole_number("SLURM_PROCID")));
    set("WORLD_SIZE", std::to_string(whole_number("SLURM_NTASKS")));
    set("LOCAL_RANK", std::to_string(env("SLURM_LOCALID") ? whole_number("SLURM_LOCALID") : 0));
    set("LOCAL_WORLD_SIZE", std::to_string(local_world));
    set("GROUP_RANK", std::to_string(node));
    if (!env("MASTER_ADDR")) {
      const bool step = env("SLURM_STEP_NODELIST") != nullptr;
      const char* list = step ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
      if (!list) throw Error("srun started this rank without SLURM_JOB_NODELIST: set MASTER_ADDR");
      set("MASTER_ADDR", slurm::expand_hostlist(list, step ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST").front());
    }
    if (!env("MASTER_PORT")) set("MASTER_PORT", std::to_string(slurm::default_port(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "")));
  } catch (const std::invalid_argument& e) {
    throw Error(e.what());
  }
  return true;
}

}  // namespace fsdpp

// fsdpp-run inside a Slurm allocation: `srun --ntasks-per-node=1 fsdpp-run ...` forms the job
// from what Slurm tells each task, with no address or port typed by hand.
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/slurm.h"
#include "launcher.h"

namespace fsdpp_run {
namespace {

const char* env(const char* name) { return std::getenv(name); }

const char* first_of(const char* a, const char* b) { return env(a) ? env(a) : env(b); }

using fsdpp::slurm::whole_number;

}  // namespace

std::string adopt_slurm_allocation(Options& o) {
  const char* nodelist = first_of("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
  const char* nnodes_text = first_of("SLURM_STEP_NUM_NODES", "SLURM_NNODES");
  const char* node_id = env("SLURM_NODEID");
  if (!nodelist || !nnodes_text || !node_id) return "";  // not in a Slurm allocation
  if (o.nnodes_given || o.node_rank_given || o.master_addr_given) return "";  // the user's flags rule
  const int nnodes = whole_number("SLURM_NNODES", nnodes_text);
  const char* step = first_of("SLURM_STEP_ID", "SLURM_STEPID");
  if (!step && nnodes > 1)
    throw std::invalid_argument("fsdpp-run runs in the batch script of a " + std::to_string(nnodes) +
                                "-node Slurm job: start one per node, with srun --ntasks-per-node=1 fsdpp-run ...");
  if (!step) return "";  // one node: the batch script's own launcher is the whole job
  const auto hosts = fsdpp::slurm::expand_hostlist(nodelist, env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST"
                                                                                      : "SLURM_JOB_NODELIST");
  if (static_cast<int>(hosts.size()) != nnodes)
    throw std::invalid_argument(std::string("the Slurm node list '") + nodelist + "' names " +
                                std::to_string(hosts.size()) + " hosts for " + std::to_string(nnodes) + " nodes");
  if (const char* tasks = first_of("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"))
    if (whole_number("SLURM_NTASKS", tasks) != nnodes)
      throw std::invalid_argument("this Slurm step runs " + std::string(tasks) + " tasks on " + std::to_string(nnodes) +
                                  " nodes: fsdpp-run starts a node's ranks itself, so srun starts one per node "
                                  "(srun --ntasks-per-node=1 fsdpp-run ...)");
  o.nnodes = nnodes;
  o.node_rank = whole_number("SLURM_NODEID", node_id);
  o.master_addr = hosts.front();
  if (!o.master_port_given && nnodes > 1) {
    o.master_port = fsdpp::slurm::default_port(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "");
    o.master_port_given = true;
  }
  return "Slurm job " + std::string(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "?") + ": node " +
         std::to_string(o.node_rank) + " of " + std::to_string(nnodes) + ", the store at " + o.master_addr + ":" +
         (nnodes > 1 ? std::to_string(o.master_port) : "a free loopback port");
}

}  // namespace fsdpp_run

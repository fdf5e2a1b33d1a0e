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

using fsdpp::slurm::whole_number;

}  // namespace

std::string adopt_slurm_allocation(Options& o) {
  const char* nodes_name = env("SLURM_STEP_NUM_NODES") ? "SLURM_STEP_NUM_NODES" : "SLURM_NNODES";
  const char* list_name = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  const char* tasks_name = env("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  if (!env(list_name) || !env(nodes_name) || !env("SLURM_NODEID")) return "";  // not in a Slurm allocation
  if (o.nnodes_given && o.node_rank_given && o.master_addr_given) return "";  // the user's flags rule
  if (o.nnodes_given && o.nnodes == 1) return "";  // a single-node job on each node, by the user's word
  const int nnodes = whole_number(nodes_name, env(nodes_name));
  const bool in_step = env("SLURM_STEP_ID") || env("SLURM_STEPID");
  if (!in_step && nnodes > 1)
    throw std::invalid_argument("fsdpp-run runs in the batch script of a " + std::to_string(nnodes) +
                                "-node Slurm job: start one per node, with srun --ntasks-per-node=1 fsdpp-run ...");
  if (!in_step) return "";  // one node: the batch script's own launcher is the whole job
  const auto hosts = fsdpp::slurm::expand_hostlist(env(list_name), list_name);
  if (static_cast<int>(hosts.size()) != nnodes)
    throw std::invalid_argument(std::string(list_name) + "='" + env(list_name) + "' names " +
                                std::to_string(hosts.size()) + " hosts for " + nodes_name + "=" + std::to_string(nnodes));
  if (env(tasks_name) && whole_number(tasks_name, env(tasks_name)) != nnodes)
    throw std::invalid_argument("this Slurm step runs " + std::string(env(tasks_name)) + " tasks on " +
                                std::to_string(nnodes) + " nodes: fsdpp-run starts a node's ranks itself, so srun "
                                "starts one per node (srun --ntasks-per-node=1 fsdpp-run ...)");
  // What the user gave stays; the rest comes from Slurm.
  if (!o.nnodes_given) o.nnodes = nnodes;
  if (!o.node_rank_given) o.node_rank = whole_number("SLURM_NODEID", env("SLURM_NODEID"));
  if (o.nnodes == 1) return "Slurm job " + std::string(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "?") + ": one node";
  if (!o.master_addr_given) o.master_addr = hosts.front();
  if (!o.master_port_given) {
    o.master_port = fsdpp::slurm::default_port(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "");
    o.master_port_given = true;
  }
  return "Slurm job " + std::string(env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "?") + ": node " +
         std::to_string(o.node_rank) + " of " + std::to_string(o.nnodes) + ", the store at " + o.master_addr + ":" +
         std::to_string(o.master_port);
}

}  // namespace fsdpp_run

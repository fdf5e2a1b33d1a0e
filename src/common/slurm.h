#pragma once
// What a Slurm allocation tells its processes, read the way Slurm writes it. Pure: no libtorch,
// so fsdpp-run (which does not link fsdpp) compiles this file too.
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpp::slurm {

// Expands a Slurm host list ("node[01-04,07],gpu-a,rack[1-2]-n[3-4]"): brackets hold numbers and
// ranges, zero padding follows the range's first number, several brackets in a name multiply.
// Throws std::invalid_argument naming `where` (the variable) and the fault.
std::vector<std::string> expand_hostlist(const std::string& list, const std::string& where);

// The store's port for a job without one given: 15000 + the job id's last four digits (as
// PyTorch Lightning's SLURMEnvironment), the same on every node and in every step of the job.
int default_port(const std::string& job_id);

// A count or id Slurm set in the variable `name`; throws std::invalid_argument naming it.
int whole_number(const std::string& name, const std::string& text);

// The tasks on each node from SLURM_TASKS_PER_NODE ("4(x2),3": 4, 4, 3); throws naming it.
std::vector<int> tasks_per_node(const std::string& text);

}  // namespace fsdpp::slurm

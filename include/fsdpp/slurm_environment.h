#pragma once
// Ranks that `srun` starts itself (one Slurm task per rank, no fsdpp-run or torchrun between).
namespace fsdpp {

// Inside an srun step (SLURM_STEP_ID) whose tasks have no launcher's RANK or WORLD_SIZE, sets
// torchrun's variables from Slurm's: RANK = SLURM_PROCID, WORLD_SIZE = SLURM_NTASKS, LOCAL_RANK =
// SLURM_LOCALID, LOCAL_WORLD_SIZE and GROUP_RANK from SLURM_TASKS_PER_NODE and SLURM_NODEID, and,
// unless already set, MASTER_ADDR = the first host of SLURM_STEP_NODELIST (else
// SLURM_JOB_NODELIST) and MASTER_PORT = 15000 + the job id's last four digits. Returns whether it
// did. init_process_group (env://) calls it; call it first to read LOCAL_RANK before that (to
// pick a GPU). Throws fsdpp::Error naming a malformed variable.
bool use_slurm_environment();

}  // namespace fsdpp

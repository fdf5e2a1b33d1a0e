#pragma once
// fsdpp: PyTorch's distributed data-parallel training stack for the libtorch C++ frontend.
#include <fsdpp/collectives.h>
#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/ddp_zero_hook.h>
#include <fsdpp/device_mesh.h>
#include <fsdpp/distributed_data_parallel.h>
#include <fsdpp/error.h>
#include <fsdpp/fully_shard.h>
#include <fsdpp/join.h>
#include <fsdpp/memory.h>
#include <fsdpp/process_group.h>
#include <fsdpp/work.h>
#include <fsdpp/wrap_policy.h>
#include <fsdpp/zero_redundancy_optimizer.h>

#pragma once
// Kept so that existing includes compile: IndexedOptimizerStateDict is now a deprecated name of
// fsdpp::OptimizerStateDict (<fsdpp/optimizer_state_dict.h>).
#include <fsdpp/optimizer_state_dict.h>

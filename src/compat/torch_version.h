#pragma once
// The one place that reads libtorch's version. Only files in src/compat/ may include it:
// everywhere else a libtorch difference is a named shim from this folder.
#include <torch/version.h>

#define FSDPP_LIBTORCH_2 (TORCH_VERSION_MAJOR >= 2)

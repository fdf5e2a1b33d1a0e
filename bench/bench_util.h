#pragma once
// What the FSDP benchmarks print besides step times (step_timer.h): sizes in MiB, the bytes a
// training state takes, and which BLAS libtorch multiplies with.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>

namespace fsdpp::bench {

inline double mib(double bytes) { return bytes / (1 << 20); }

// Bytes of the parameters, their gradients and Adam's exp_avg and exp_avg_sq (each tensor once).
inline int64_t state_bytes(const std::vector<at::Tensor>& params) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& p : params)
    if (seen.insert(p.unsafeGetTensorImpl()).second) bytes += 4 * p.numel() * p.element_size();
  return bytes;
}

// The BLAS this process loaded (libtorch's libblas.so.3, resolved: Debian's alternatives pick
// OpenBLAS or the reference BLAS, ~15x slower here) and OPENBLAS_NUM_THREADS, as
// scripts/describe-platform.sh names them.
inline std::string blas_description() {
  std::ifstream maps("/proc/self/maps");
  std::string line, path;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string file = line.substr(slash);
    if (file.find("libblas.so") != std::string::npos) {
      path = file;
      break;
    }
  }
  std::string out = path.empty()                                 ? std::string("no libblas.so loaded")
                    : path.find("openblas") != std::string::npos ? "OpenBLAS (" + path + ")"
                                                                 : "reference BLAS (" + path + ")";
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  return out + ", OPENBLAS_NUM_THREADS=" + (threads ? threads : "unset");
}

}  // namespace fsdpp::bench

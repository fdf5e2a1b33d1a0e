// The backend string read as what carries CUDA tensors (device_backend.h).
#include "comm/device_backend.h"

#include <sstream>

#include <fsdpp/error.h>

namespace fsdpp::detail {

DeviceBackend device_backend_of(const std::string& backend) {
  const std::string expected = "'gloo', 'nccl', 'fake' or device:backend pairs such as 'cpu:gloo,cuda:nccl'";
  if (backend == "gloo") return DeviceBackend::kGloo;
  if (backend == "nccl") return DeviceBackend::kNccl;
  if (backend == "fake") return DeviceBackend::kFake;
  if (backend == "nccl-contract") return DeviceBackend::kNcclContract;
  if (backend.find(':') == std::string::npos)
    throw Error("backend '" + backend + "' is not available: fsdpp takes " + expected);
  DeviceBackend cuda = DeviceBackend::kGloo;
  std::stringstream pairs(backend);
  for (std::string pair; std::getline(pairs, pair, ',');) {
    const auto colon = pair.find(':');
    const std::string device = pair.substr(0, colon);
    const std::string name = colon == std::string::npos ? "" : pair.substr(colon + 1);
    if (device == "cpu" && name == "gloo") continue;
    if (device == "cuda" && (name == "gloo" || name == "nccl")) {
      cuda = name == "nccl" ? DeviceBackend::kNccl : DeviceBackend::kGloo;
      continue;
    }
    throw Error("backend '" + backend + "': '" + pair + "' is not available: fsdpp takes " + expected +
                " (cpu tensors over gloo, cuda tensors over gloo or nccl)");
  }
  return cuda;
}

}  // namespace fsdpp::detail

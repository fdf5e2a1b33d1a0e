// A stranger who reaches a running elastic job's rendezvous store without its secret:
//   store_stranger HOST PORT RDZV_ID
// reads every key fsdpp-run's rendezvous and the ranks would use without a secret, then forges
// the ones that would end the job ("failed"), move it to another round, or add members. Prints
// what it could read; exit code 0 if nothing, 1 if it read a key. The job around it checks that
// the forgeries changed nothing.
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "compat/tcp_store_options.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: store_stranger HOST PORT RDZV_ID\n");
    return 2;
  }
  c10d::TCPStoreOptions options = fsdpp::compat::tcp_store_options();
  options.port = static_cast<std::uint16_t>(std::stoi(argv[2]));
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(10);
  c10d::TCPStore store(argv[1], options);
  const std::string rdzv = std::string("rdzv/") + argv[3] + "/";
  std::vector<std::string> keys = {rdzv + "round", rdzv + "failed"};
  for (int round = 0; round < 4; ++round)
    for (const char* name : {"joined", "formed", "end", "nproc0", "nproc1", "beat0", "beat1", "finished0"})
      keys.push_back(rdzv + "r" + std::to_string(round) + "/" + name);
  for (int attempt = 0; attempt < 4; ++attempt)  // what the ranks' process group would set first
    for (int rank = 0; rank < 4; ++rank)
      keys.push_back("/worker/attempt_" + std::to_string(attempt) + "/fsdpp/world//arrived/" + std::to_string(rank));
  int read = 0;
  for (const auto& key : keys)
    if (store.check({key})) {
      const auto value = store.get(key);
      std::printf("stranger: read %s = %s\n", key.c_str(), std::string(value.begin(), value.end()).c_str());
      ++read;
    }
  store.set(rdzv + "failed", std::vector<uint8_t>{'f', 'o', 'r', 'g', 'e', 'd'});
  store.set(rdzv + "round", std::vector<uint8_t>{'4', '1'});
  store.add(rdzv + "r0/joined", 5);
  std::printf("stranger: read %d of %zu keys a job without a secret uses; forged %sfailed, %sround, %sr0/joined\n",
              read, keys.size(), rdzv.c_str(), rdzv.c_str(), rdzv.c_str());
  return read == 0 ? 0 : 1;
}

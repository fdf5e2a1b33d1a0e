#pragma once
// Counts collectives, like PyTorch's CommDebugMode: while a CommDebugMode is alive, every
// fsdpp collective issued by this process is recorded with the bytes this rank puts on the
// wire (payload bytes of the algorithm used; see docs/api.md). Modes may nest.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace fsdpp {

class CommDebugMode {
 public:
  CommDebugMode();
  ~CommDebugMode();
  CommDebugMode(const CommDebugMode&) = delete;
  CommDebugMode& operator=(const CommDebugMode&) = delete;

  // Keys are the collectives' names: "all_reduce", "all_gather_into_tensor", ...
  std::map<std::string, int64_t> get_comm_counts() const;
  int64_t get_total_counts() const;
  int64_t count(const std::string& collective) const;
  int64_t bytes_sent(const std::string& collective) const;
  int64_t total_bytes_sent() const;
  void reset();

  // Called by the collectives; not for users.
  static void record(const char* collective, int64_t bytes_sent);

 private:
  void add(const char* collective, int64_t bytes_sent);

  mutable std::mutex mutex_;
  std::map<std::string, int64_t> counts_;
  std::map<std::string, int64_t> bytes_;
};

}  // namespace fsdpp

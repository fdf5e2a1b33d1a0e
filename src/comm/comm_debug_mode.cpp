#include <fsdpp/comm_debug_mode.h>

#include <algorithm>
#include <vector>

namespace fsdpp {
namespace {
std::mutex g_active_mutex;
std::vector<CommDebugMode*> g_active;
}  // namespace

CommDebugMode::CommDebugMode() {
  std::lock_guard<std::mutex> lock(g_active_mutex);
  g_active.push_back(this);
}

CommDebugMode::~CommDebugMode() {
  std::lock_guard<std::mutex> lock(g_active_mutex);
  g_active.erase(std::remove(g_active.begin(), g_active.end(), this), g_active.end());
}

void CommDebugMode::record(const char* collective, int64_t bytes_sent) {
  std::lock_guard<std::mutex> lock(g_active_mutex);
  for (CommDebugMode* mode : g_active) mode->add(collective, bytes_sent);
}

void CommDebugMode::add(const char* collective, int64_t bytes_sent) {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_[collective] += 1;
  bytes_[collective] += bytes_sent;
}

std::map<std::string, int64_t> CommDebugMode::get_comm_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

int64_t CommDebugMode::get_total_counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [name, n] : counts_) total += n;
  return total;
}

int64_t CommDebugMode::count(const std::string& collective) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = counts_.find(collective);
  return it == counts_.end() ? 0 : it->second;
}

int64_t CommDebugMode::bytes_sent(const std::string& collective) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = bytes_.find(collective);
  return it == bytes_.end() ? 0 : it->second;
}

int64_t CommDebugMode::total_bytes_sent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& [name, n] : bytes_) total += n;
  return total;
}

void CommDebugMode::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_.clear();
  bytes_.clear();
}

}  // namespace fsdpp

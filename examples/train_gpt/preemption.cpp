#include "preemption.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

#include <ATen/ops/full.h>

#include <fsdpp/collectives.h>

namespace train_gpt {
namespace {

// Set by the handler, read after each step; nothing else happens in the handler.
volatile std::sig_atomic_t received = 0;

extern "C" void record_signal(int signal) { received = signal; }

const std::vector<std::pair<std::string, int>>& catchable() {
  static const std::vector<std::pair<std::string, int>> table = {
      {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"TERM", SIGTERM},
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"XCPU", SIGXCPU}, {"ALRM", SIGALRM}};
  return table;
}

}  // namespace

int signal_number(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char ch) { return std::toupper(ch); });
  if (upper.rfind("SIG", 0) == 0) upper = upper.substr(3);
  for (const auto& [short_name, number] : catchable())
    if (upper == short_name) return number;
  throw std::invalid_argument("--exit-signal " + name +
                              ": expected one of SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGXCPU, SIGALRM");
}

std::string signal_name(int signal) {
  for (const auto& [short_name, number] : catchable())
    if (number == signal) return "SIG" + short_name;
  return "signal " + std::to_string(signal);
}

StopRequest::StopRequest(int exit_signal) {
  struct sigaction action = {};
  action.sa_handler = record_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write it interrupts (a collective's socket) goes on
  for (int signal : {SIGTERM, exit_signal}) {
    if (std::any_of(previous_.begin(), previous_.end(), [&](const auto& p) { return p.first == signal; })) continue;
    struct sigaction old = {};
    ::sigaction(signal, &action, &old);
    previous_.emplace_back(signal, old);
  }
}

StopRequest::~StopRequest() {
  for (const auto& [signal, old] : previous_) ::sigaction(signal, &old, nullptr);
}

int StopRequest::agreed() const {
  at::Tensor flag = at::full({1}, static_cast<int64_t>(received), at::kLong);
  fsdpp::all_reduce(flag, fsdpp::ReduceOp::MAX);
  return static_cast<int>(flag.item<int64_t>());
}

int restart_count() {
  for (const char* name : {"FSDPP_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return std::atoi(value);
  return 0;
}

}  // namespace train_gpt

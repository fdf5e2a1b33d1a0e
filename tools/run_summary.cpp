#include "run_summary.h"

#include <string.h>
#include <sys/wait.h>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

namespace fsdpp_run {
namespace {

std::string list(const std::set<int>& ranks) {
  std::ostringstream out;
  out << "[";
  bool first = true;
  for (int r : ranks) out << (first ? "" : ", ") << r, first = false;
  out << "]";
  return out.str();
}

// The ranks inside "rank(s) [2, 5] had not arrived" of a timeout report.
std::set<int> named_missing(const std::string& report) {
  std::set<int> ranks;
  const std::string lead = "rank(s) [";
  const size_t at = report.find(lead);
  if (at == std::string::npos || report.find("] had not arrived", at) == std::string::npos) return ranks;
  std::istringstream in(report.substr(at + lead.size(), report.find(']', at) - at - lead.size()));
  for (std::string item; std::getline(in, item, ',');) {
    try {
      ranks.insert(std::stoi(item));
    } catch (const std::exception&) {
    }
  }
  return ranks;
}

std::string fate(const RankFate& r) {
  std::string who = "rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ")";
  if (r.stopped_by_us) {
    if (r.state_at_stop == 'T' || r.state_at_stop == 't')
      return who + " was stopped (by SIGSTOP or a debugger) when the job was ended";
    return who + " was still running (state " + std::string(1, r.state_at_stop) + ") when the job was ended";
  }
  if (!r.reaped) return who + " was still running";
  if (WIFSIGNALED(r.status)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(r.status));
    return who + " was killed by " + (abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(WTERMSIG(r.status)));
  }
  return who + " exited with code " + std::to_string(WEXITSTATUS(r.status));
}

}  // namespace

char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  return paren == std::string::npos || text.size() < paren + 3 ? '?' : text[paren + 2];
}

std::vector<std::string> summarize(const std::vector<RankFate>& ranks) {
  std::vector<std::string> lines;
  std::set<int> timed_out, missing;
  for (const auto& r : ranks) {
    std::string line = fate(r);
    if (!r.timeout_report.empty()) {
      line += ", after its collective timed out";
      timed_out.insert(r.rank);
      for (int m : named_missing(r.timeout_report)) missing.insert(m);
    }
    lines.push_back(line);
  }
  if (!timed_out.empty())
    lines.push_back("rank(s) " + list(timed_out) + " timed out in a collective" +
                    (missing.empty() ? std::string(" (see their reports above)")
                                     : ", naming rank(s) " + list(missing) + " as not arrived"));
  return lines;
}

}  // namespace fsdpp_run

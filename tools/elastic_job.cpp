// One node of an elastic fsdpp-run job: each attempt is a rendezvous round. A round ends when
// the ranks succeed, fail (a restart, charged to this node's --max-restarts, unless another node
// ended the round first), or the membership changes (a node lost, one waiting to join: the
// ranks are stopped as a scheduler stops them, with SIGTERM and the signal grace, and not
// charged). The node serving the store must outlive the job, as torchrun's does.
#include <memory>
#include <string>
#include <vector>

#include "elastic_rendezvous.h"
#include "launcher.h"

namespace fsdpp_run {
namespace {

std::string round_name(const Round& round) { return "rendezvous round " + std::to_string(round.number); }

void print_summary(const std::vector<std::string>& rounds) {
  for (const auto& line : rounds) say("summary: " + line);
}

// What one round's attempt learns from the rendezvous while its ranks run.
struct RoundWatch {
  RoundEnd end;              // the first reason the round ended, seen by this node's check
  bool failed_here = false;  // a rank of this node failed first
};

// This node's ranks for `round`, wired to the rendezvous: it polls for membership changes, and
// a failing rank or a forwarded signal ends the round at once. Then the other nodes, whose ranks
// fail on the lost peers next, know the failure was this node's (and spend no restart of theirs
// on it), and no node starts a round without this one before it has ended the job.
Attempt round_attempt(const Options& options, const Round& round, ElasticRendezvous& rendezvous,
                      const int& failures, RoundWatch& watch) {
  Attempt attempt;
  attempt.number = round.number;
  attempt.master_port = options.rdzv_port;
  attempt.agent_store = true;
  attempt.membership_changed = [&rendezvous, &watch, round] {
    RoundEnd seen = rendezvous.check(round);  // also this node's heartbeat
    if (watch.end.reason.empty()) watch.end = seen;
    return seen.reason;
  };
  const std::string node = "node " + std::to_string(round.node_rank) + ": ";
  attempt.rank_failed = [&options, &rendezvous, &watch, &failures, round, node](const std::string& what, int code) {
    if (rendezvous.ended(round)) return;
    watch.failed_here = true;
    AttemptEnd failure;
    failure.exit_code = code;
    if (why_not_restarted(failure, failures, options).empty())
      rendezvous.end(round, node + what);
    else
      rendezvous.fail(node + what);
  };
  attempt.told_to_stop = [&rendezvous, round, node](const std::string& what) { rendezvous.end(round, node + what); };
  return attempt;
}

}  // namespace

int run_elastic_job(const Options& options) {
  // First: the store's threads must start with the signals blocked, or they would take them.
  sigset_t original_mask;
  const int signal_fd = start_supervising(original_mask);
  if (signal_fd < 0) return 1;
  std::unique_ptr<ElasticRendezvous> rendezvous;
  try {
    rendezvous = std::make_unique<ElasticRendezvous>(options, signal_fd);
  } catch (const RendezvousError& e) {
    say(e.what());
    return e.exit_code;
  }
  int failures = 0;
  std::vector<std::string> summary;
  for (;;) {
    Round round;
    try {
      round = rendezvous->join(signal_fd);
    } catch (const RendezvousError& e) {
      say(e.what());
      print_summary(summary);
      return e.exit_code;
    }
    const int first = round.node_rank * options.nproc_per_node;
    say(round_name(round) + " at " + options.rdzv_endpoint + ": node " + std::to_string(round.node_rank) + " of " +
        std::to_string(round.nnodes) + ", ranks " + std::to_string(first) + "-" +
        std::to_string(first + options.nproc_per_node - 1) + " of a world of " +
        std::to_string(round.nnodes * options.nproc_per_node));
    Options round_options = options;
    round_options.nnodes = round.nnodes;
    round_options.node_rank = round.node_rank;
    round_options.master_addr = options.rdzv_host;
    RoundWatch watch;
    const Attempt attempt = round_attempt(options, round, *rendezvous, failures, watch);
    const AttemptEnd end = run_attempt(round_options, attempt, signal_fd, original_mask);
    summary.push_back(round_name(round) + " (" + std::to_string(round.nnodes) + " node(s)): " + end.reason +
                      (end.membership_changed ? "" : " (exit code " + std::to_string(end.exit_code) + ")"));
    if (end.exit_code == 0 && !end.membership_changed) {
      rendezvous->finish(round, signal_fd, options.exit_wait_seconds);
      return 0;
    }
    if (end.forwarded_signal != 0) {
      // The others re-form without this node, or (preempted together) leave too: until they
      // have, a node serving the store keeps it, for a bounded while.
      rendezvous->finish(round, signal_fd, options.keep_alive_interval * options.keep_alive_max_attempt);
      return end.exit_code;
    }
    if (watch.end.job_failed && !watch.failed_here) {  // another node's failure
      rendezvous->await_failure_seen(round);
      print_summary(summary);
      return 1;
    }
    if (!watch.failed_here && (end.membership_changed || rendezvous->ended(round))) {
      if (!end.membership_changed) say(round_name(round) + " had ended when " + end.reason + "; joining the next round");
      continue;
    }
    const std::string node = "node " + std::to_string(round.node_rank) + ": ";
    if (const std::string why_not = why_not_restarted(end, failures, options); !why_not.empty()) {
      rendezvous->fail(node + end.reason);
      rendezvous->await_failure_seen(round);
      say(round_name(round) + " ended (" + end.reason + "); not restarted: " + why_not);
      print_summary(summary);
      return end.exit_code;
    }
    ++failures;
    rendezvous->end(round, node + end.reason);  // if no rank's failure ended it (a rank could not start)
    say(round_name(round) + " ended (" + end.reason + "); re-forming (restart " + std::to_string(failures) + " of " +
        std::to_string(options.max_restarts) + " for this node)");
  }
}

}  // namespace fsdpp_run

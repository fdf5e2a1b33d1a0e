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

// Why this node's failure ends the job rather than the round, or "".
std::string why_not_restarted_here(const AttemptEnd& end, int failures, const Options& options) {
  const std::string why_not = why_not_restarted(end);
  if (why_not.empty() && failures == options.max_restarts)
    return "no restarts left (--max-restarts " + std::to_string(options.max_restarts) + ")";
  return why_not;
}

void print_summary(const std::vector<std::string>& rounds) {
  for (const auto& line : rounds) say("summary: " + line);
}

}  // namespace

int run_elastic_job(const Options& options, int signal_fd, const sigset_t& original_mask) {
  std::unique_ptr<ElasticRendezvous> rendezvous;
  try {
    rendezvous = std::make_unique<ElasticRendezvous>(options);
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
    const int world = round.nnodes * options.nproc_per_node, first = round.node_rank * options.nproc_per_node;
    say(round_name(round) + " at " + options.rdzv_endpoint + ": node " + std::to_string(round.node_rank) + " of " +
        std::to_string(round.nnodes) + ", ranks " + std::to_string(first) + "-" +
        std::to_string(first + options.nproc_per_node - 1) + " of a world of " + std::to_string(world));
    Options round_options = options;
    round_options.nnodes = round.nnodes;
    round_options.node_rank = round.node_rank;
    round_options.master_addr = options.rdzv_host;
    RoundEnd round_end;
    Attempt attempt;
    attempt.number = round.number;
    attempt.master_port = options.rdzv_port;
    attempt.agent_store = true;
    attempt.membership_changed = [&] {
      round_end = rendezvous->check(round);
      return round_end.reason;
    };
    // Decided at once, so that the other nodes, whose ranks now fail on the lost peers, know
    // the failure was this node's (and spend no restart of theirs on it), and so that no node
    // starts a round without this one before it has ended the job.
    const std::string node = "node " + std::to_string(round.node_rank) + ": ";
    bool failed_here = false;
    attempt.rank_failed = [&](const std::string& what, int exit_code) {
      if (rendezvous->ended(round)) return;
      failed_here = true;
      AttemptEnd failure;
      failure.exit_code = exit_code;
      if (why_not_restarted_here(failure, failures, options).empty())
        rendezvous->end(round, node + what);
      else
        rendezvous->fail(node + what);
    };
    const AttemptEnd end = run_attempt(round_options, attempt, signal_fd, original_mask);
    summary.push_back(round_name(round) + " (" + std::to_string(round.nnodes) + " node(s)): " + end.reason +
                      (end.membership_changed ? "" : " (exit code " + std::to_string(end.exit_code) + ")"));
    if (end.exit_code == 0 && !end.membership_changed) {
      rendezvous->finish(round);
      return 0;
    }
    // Told to stop: this node's heartbeat stops with it, and the others re-form without it.
    if (end.forwarded_signal != 0) return end.exit_code;
    if (end.membership_changed) {
      if (!round_end.job_failed) continue;
      print_summary(summary);
      return 1;
    }
    if (!failed_here && rendezvous->ended(round)) {
      say(round_name(round) + " had ended when " + end.reason + "; joining the next round");
      continue;
    }
    if (const std::string why_not = why_not_restarted_here(end, failures, options); !why_not.empty()) {
      rendezvous->fail(node + end.reason);
      rendezvous->await_failure_seen(round);
      say(round_name(round) + " ended (" + end.reason + "); not restarted: " + why_not);
      print_summary(summary);
      return end.exit_code;
    }
    ++failures;
    rendezvous->end(round, node + end.reason);  // if the failure was not a rank's (a rank could not start)
    say(round_name(round) + " ended (" + end.reason + "); re-forming (restart " + std::to_string(failures) + " of " +
        std::to_string(options.max_restarts) + " for this node)");
  }
}

}  // namespace fsdpp_run

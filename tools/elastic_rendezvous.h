#pragma once
// The elastic rendezvous of an fsdpp-run job across nodes, torchrun's c10d backend in kind: the
// launchers meet on c10d's TCPStore at --rdzv-endpoint (served by the launcher on that host),
// agree on the members of a round, their node ranks and the world size, and re-form in a new
// round when a node is lost or another waits to join. Keys live under "rdzv/<id>/" and, with
// FSDPP_STORE_SECRET, under the secret.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <map>
#include <stdexcept>
#include <string>

#include "launcher.h"

namespace fsdpp_run {

// A failed rendezvous, or a job another node ended: one line for the user.
struct RendezvousError : std::runtime_error {
  explicit RendezvousError(const std::string& what, int code = 1) : std::runtime_error(what), exit_code(code) {}
  int exit_code;  // fsdpp-run's
};

// One formed round: this node's place in it.
struct Round {
  int number = 0;
  int node_rank = 0;
  int nnodes = 0;
};

// Why a running round ends, if it does.
struct RoundEnd {
  std::string reason;        // "" while it goes on
  bool job_failed = false;   // another node ended the job: no new round
};

class ElasticRendezvous {
 public:
  // Serves the store if the endpoint is an address of this machine (and its port is free),
  // else connects to it once it is served, within join_timeout; throws RendezvousError naming
  // the endpoint, or on a SIGINT/SIGTERM on `signal_fd` meanwhile.
  ElasticRendezvous(const Options& options, int signal_fd);

  bool serves_store() const { return listen_fd_ >= 0; }

  // Joins the open round and returns once it is formed with this node in it; a node that comes
  // after a round is formed waits for the next. Throws RendezvousError after --rdzv-conf
  // join_timeout, if the job has failed, or if a SIGINT/SIGTERM arrives on `signal_fd`.
  Round join(int signal_fd);

  // While the round runs: beats for this node, and says whether the round ends (another node
  // ended it, lost a node, or sees one waiting to join). Ends it for everyone when it is this
  // node that noticed.
  RoundEnd check(const Round& round);

  // Whether some node has ended `round` already (then this node's failure follows from it).
  bool ended(const Round& round);
  // Ends `round` for every node, saying why, and opens the next.
  void end(const Round& round, const std::string& reason);
  // Ends the job for every node: no new round.
  void fail(const std::string& reason);
  // The node serving the store waits (bounded) for the other members of `round` to have read
  // that the job failed: without the store they would keep their ranks running.
  void await_failure_seen(const Round& round);
  // This node leaves `round` (its ranks finished, or it was told to stop); the node serving the
  // store waits (up to `wait_seconds`, or a SIGINT/SIGTERM on `signal_fd`) for the others to
  // leave too or be lost, so nobody loses the store while it still needs it.
  void finish(const Round& round, int signal_fd, double wait_seconds);

 private:
  std::string key(const Round& round, const std::string& name) const;
  bool has(const std::string& key);
  std::string value(const std::string& key);
  int64_t counter(const std::string& key) { return store_->add(key, 0); }
  std::string lost_node(const Round& round);
  bool job_failed();  // and says it has seen it
  void throw_if_failed();

  const Options& options_;
  int listen_fd_ = -1;
  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::steady_clock::time_point next_beat_;
  std::map<int, std::pair<int64_t, std::chrono::steady_clock::time_point>> beats_seen_;  // node -> beat, when
  bool store_lost_ = false;
  bool failure_seen_ = false;
};

}  // namespace fsdpp_run

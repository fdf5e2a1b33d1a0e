// The elastic rendezvous on c10d's TCPStore. Keys, under "rdzv/<id>/":
//   round                 the open round's number
//   failed                why the job failed; no node starts another round
//   r<R>/joined           nodes that joined round R (an add; a node's count is its node rank + 1)
//   r<R>/formed           how many of them are its members, set once (compareSet)
//   r<R>/nproc<K>         node K's ranks
//   r<R>/beat<K>          node K's heartbeat (an add, so no clocks need to agree)
//   r<R>/finished<K>      node K left the round: its ranks exited 0, or it was told to stop
//   r<R>/end              why round R ended, set once
#include "elastic_rendezvous.h"

#include <netdb.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <optional>
#include <random>
#include <thread>

#include "comm/error_message.h"
#include "common/store_secret.h"
#include "compat/tcp_store_options.h"

namespace fsdpp_run {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }
std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}


// Waits up to `ms` for a SIGINT/SIGTERM on the launcher's signal descriptor; throws if one came.
void wait_unless_told_to_stop(int signal_fd, int ms) {
  pollfd fd{signal_fd, POLLIN, 0};
  if (poll(&fd, 1, ms) <= 0) return;
  if (const int sig = pending_stop_signal(signal_fd))
    throw RendezvousError("fsdpp-run received " + signal_name(sig) + " while waiting for the rendezvous", 128 + sig);
}

// Whether something accepts connections at host:port now.
bool served(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) return false;
  // Non-blocking, at most 1 s: an address nobody answers would hold connect() for minutes.
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool connected = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0;
  if (fd >= 0 && !connected && errno == EINPROGRESS) {
    pollfd writable{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    connected = poll(&writable, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return connected;
}

// A socket listening at host:port if host is this machine's and nobody serves the port yet,
// else -1. Two launchers here starting together can both fail to listen (each sees the other's
// half-made listener): then neither serves, so they try again, at random moments.
int listen_unless_served(const std::string& host, int port) {
  std::mt19937 random(std::random_device{}());
  for (int attempt = 0; attempt < 20; ++attempt) {
    int bound = 0;
    const int fd = listen_on(host, port, bound);
    if (fd >= 0 || errno != EADDRINUSE || served(host, port)) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(5, 50)(random)));
  }
  return -1;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(const Options& options, int signal_fd) : options_(options) {
  const char* secret = std::getenv(fsdpp::kStoreSecretVariable);
  if (secret && !fsdpp::store_secret_problem(secret).empty())
    throw RendezvousError(fsdpp::store_secret_problem(secret), kUsageErrorExitCode);
  // Binding succeeds only on an address of this machine: then this launcher serves the store,
  // on that address alone. Otherwise (another machine's address, or another launcher here
  // serves it already) it is a client, as torchrun's agents are.
  listen_fd_ = listen_unless_served(options.rdzv_host, options.rdzv_port);
  // c10d's client would retry inside its constructor, deaf to Ctrl-C: wait for the server here.
  const auto deadline = Clock::now() + seconds(options.join_timeout);
  while (listen_fd_ < 0 && !served(options.rdzv_host, options.rdzv_port)) {
    if (Clock::now() >= deadline)
      throw RendezvousError("nothing serves the rendezvous store at " + options.rdzv_endpoint + " within join_timeout " +
                            std::to_string(static_cast<long long>(options.join_timeout)) +
                            " s (the launcher on its host serves it)");
    wait_unless_told_to_stop(signal_fd, 100);
  }
  c10d::TCPStoreOptions store_options = fsdpp::compat::tcp_store_options();
  store_options.port = static_cast<std::uint16_t>(options.rdzv_port);
  store_options.isServer = listen_fd_ >= 0;
  if (listen_fd_ >= 0) store_options.masterListenFd = listen_fd_;
  store_options.waitWorkers = false;
  store_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.join_timeout * 1000));
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(options.rdzv_host, store_options);
    if (secret) store = c10::make_intrusive<c10d::PrefixStore>(fsdpp::store_secret_prefix(secret), store);
    store_ = c10::make_intrusive<c10d::PrefixStore>("rdzv/" + options.rdzv_id, store);
  } catch (const std::exception& e) {
    throw RendezvousError("cannot reach the rendezvous store at " + options.rdzv_endpoint + " within " +
                          std::to_string(static_cast<long long>(options.join_timeout)) + " s: " +
                          fsdpp::detail::message_without_backtrace(e));
  }
}

std::string ElasticRendezvous::key(const Round& round, const std::string& name) const {
  return "r" + std::to_string(round.number) + "/" + name;
}

bool ElasticRendezvous::has(const std::string& key) { return store_->check({key}); }

std::string ElasticRendezvous::value(const std::string& key) { return text(store_->get(key)); }

Round ElasticRendezvous::join(int signal_fd) {
  store_lost_ = false;  // a join that gets through has the store back
  const auto deadline = Clock::now() + seconds(options_.join_timeout);
  const std::string timeout_text = std::to_string(static_cast<long long>(options_.join_timeout));
  try {
    for (;;) {
      throw_if_failed();
      Round round;
      round.number = std::stoi(text(store_->compareSet("round", {}, bytes("0"))));
      const int64_t arrival = store_->add(key(round, "joined"), 1);
      round.node_rank = static_cast<int>(arrival - 1);
      store_->set(key(round, "nproc" + std::to_string(round.node_rank)), bytes(std::to_string(options_.nproc_per_node)));
      std::optional<Clock::time_point> last_call;
      while (!has(key(round, "formed"))) {
        throw_if_failed();
        const int64_t joined = counter(key(round, "joined"));
        if (joined >= options_.min_nodes && !last_call) last_call = Clock::now() + seconds(options_.last_call_timeout);
        if (joined >= options_.max_nodes || (last_call && Clock::now() >= *last_call)) {
          store_->compareSet(key(round, "formed"), {}, bytes(std::to_string(std::min<int64_t>(joined, options_.max_nodes))));
          continue;
        }
        if (Clock::now() >= deadline)
          throw RendezvousError("no rendezvous at " + options_.rdzv_endpoint + " within join_timeout " + timeout_text +
                                " s: " + std::to_string(joined) + " of at least " + std::to_string(options_.min_nodes) +
                                " nodes joined round " + std::to_string(round.number));
        wait_unless_told_to_stop(signal_fd, 100);
      }
      round.nnodes = std::stoi(value(key(round, "formed")));
      if (arrival <= round.nnodes) {
        for (int k = 0; k < round.nnodes; ++k) {
          const int nproc = std::stoi(value(key(round, "nproc" + std::to_string(k))));
          if (nproc != options_.nproc_per_node)
            throw RendezvousError("node " + std::to_string(k) + " of rendezvous round " + std::to_string(round.number) +
                                  " starts " + std::to_string(nproc) + " ranks and this node " +
                                  std::to_string(options_.nproc_per_node) +
                                  ": every node of an elastic job needs the same --nproc-per-node",
                                  kUsageErrorExitCode);
        }
        beats_seen_.clear();
        next_beat_ = Clock::now();
        return round;
      }
      // Formed without this node: its members start the next round when they see it waiting.
      say("rendezvous round " + std::to_string(round.number) + " formed with " + std::to_string(round.nnodes) +
          " node(s) before this one joined; waiting for the next round");
      while (std::stoi(value("round")) == round.number) {
        throw_if_failed();
        if (Clock::now() >= deadline)
          throw RendezvousError("no rendezvous round at " + options_.rdzv_endpoint + " admitted this node within "
                                "join_timeout " + timeout_text + " s (round " + std::to_string(round.number) +
                                " has " + std::to_string(round.nnodes) + " of at most " +
                                std::to_string(options_.max_nodes) + " nodes)");
        wait_unless_told_to_stop(signal_fd, 200);
      }
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const std::exception& e) {
    throw RendezvousError("rendezvous at " + options_.rdzv_endpoint + " failed: " + fsdpp::detail::message_without_backtrace(e));
  }
}

bool ElasticRendezvous::job_failed() {
  if (!has("failed")) return false;
  if (!failure_seen_) store_->add("failed/seen", 1);  // the node serving the store waits for this
  failure_seen_ = true;
  return true;
}

void ElasticRendezvous::throw_if_failed() {
  if (job_failed()) throw RendezvousError("the job failed on another node: " + value("failed"));
}

std::string ElasticRendezvous::lost_node(const Round& round) {
  const auto now = Clock::now();
  const double allowed = options_.keep_alive_interval * options_.keep_alive_max_attempt;
  for (int k = 0; k < round.nnodes; ++k) {
    if (k == round.node_rank) continue;
    const int64_t beat = counter(key(round, "beat" + std::to_string(k)));
    auto seen = beats_seen_.find(k);
    if (seen == beats_seen_.end() || seen->second.first != beat) {
      beats_seen_[k] = {beat, now};
    } else if (now - seen->second.second > seconds(allowed) && !has(key(round, "finished" + std::to_string(k)))) {
      return "node " + std::to_string(k) + " of rendezvous round " + std::to_string(round.number) +
             " was lost (no heartbeat for " + std::to_string(static_cast<long long>(allowed)) + " s)";
    }
  }
  return "";
}

RoundEnd ElasticRendezvous::check(const Round& round) {
  if (store_lost_) return {};
  try {
    if (Clock::now() >= next_beat_) {
      store_->add(key(round, "beat" + std::to_string(round.node_rank)), 1);
      next_beat_ = Clock::now() + seconds(options_.keep_alive_interval);
    }
    if (job_failed()) return {"the job failed on another node: " + value("failed"), true};
    if (has(key(round, "end"))) return {value(key(round, "end")), false};
    const int64_t joined = counter(key(round, "joined"));
    std::string reason;
    if (joined > round.nnodes && round.nnodes < options_.max_nodes)
      reason = std::to_string(joined - round.nnodes) + " node(s) waiting to join";
    else
      reason = lost_node(round);
    if (!reason.empty()) end(round, reason);
    return {reason, false};
  } catch (const std::exception& e) {
    store_lost_ = true;
    say("lost the rendezvous store at " + options_.rdzv_endpoint + " (" + fsdpp::detail::message_without_backtrace(e) +
        "); the ranks go on, but this node can no longer re-form");
    return {};
  }
}

bool ElasticRendezvous::ended(const Round& round) {
  try {
    return has(key(round, "end")) || has("failed");
  } catch (const std::exception&) {
    return false;
  }
}

void ElasticRendezvous::end(const Round& round, const std::string& reason) {
  try {
    store_->compareSet(key(round, "end"), {}, bytes(reason));
    store_->compareSet("round", bytes(std::to_string(round.number)), bytes(std::to_string(round.number + 1)));
  } catch (const std::exception& e) {
    say("cannot tell the other nodes that round " + std::to_string(round.number) + " ended: " + fsdpp::detail::message_without_backtrace(e));
  }
}

void ElasticRendezvous::fail(const std::string& reason) {
  try {
    store_->compareSet("failed", {}, bytes(reason));
  } catch (const std::exception& e) {
    say("cannot tell the other nodes that the job failed: " + fsdpp::detail::message_without_backtrace(e));
  }
}

void ElasticRendezvous::await_failure_seen(const Round& round) {
  if (!serves_store()) return;
  try {
    const auto deadline = Clock::now() + seconds(options_.keep_alive_interval * options_.keep_alive_max_attempt);
    while (counter("failed/seen") < round.nnodes - 1 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } catch (const std::exception&) {
  }
}

void ElasticRendezvous::finish(const Round& round, int signal_fd, double wait_seconds) {
  try {
    store_->set(key(round, "finished" + std::to_string(round.node_rank)), bytes("1"));
    if (!serves_store()) return;
    auto unfinished = [&] {
      for (int k = 0; k < round.nnodes; ++k)
        if (k != round.node_rank && !has(key(round, "finished" + std::to_string(k)))) return true;
      return false;
    };
    const auto deadline = Clock::now() + seconds(wait_seconds);
    while (unfinished() && lost_node(round).empty() && Clock::now() < deadline) {
      store_->add(key(round, "beat" + std::to_string(round.node_rank)), 1);
      wait_unless_told_to_stop(signal_fd, 200);
    }
  } catch (const RendezvousError& e) {
    say(std::string(e.what()) + "; not waiting for the other nodes to finish");
  } catch (const std::exception& e) {
    say("rendezvous at " + options_.rdzv_endpoint + ": " + fsdpp::detail::message_without_backtrace(e));
  }
}

}  // namespace fsdpp_run

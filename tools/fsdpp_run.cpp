// fsdpp-run: a torchrun-like launcher.
//
// Starts --nproc-per-node copies of a program with torchrun's environment
// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...), prefixes every line they
// print with "[rank<R>]: ", and tears the whole job down when any rank fails
// or the launcher is told to stop. It never leaves processes behind: each rank
// runs in its own process group, which is signalled as a whole, and dies with
// the launcher (PR_SET_PDEATHSIG) even if the launcher is SIGKILLed.
// This file reads the options; job_restarts.cpp runs the job's attempts, rank_supervisor.cpp
// each attempt's ranks, output_relay.cpp their output.

#include <CLI/CLI.hpp>

#include <climits>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/host_port.h"
#include "common/loopback.h"
#include "common/store_secret.h"
#include "launcher.h"

namespace {

using fsdpp_run::Options;
using fsdpp_run::say;

constexpr int kUsageError = fsdpp_run::kUsageErrorExitCode;

// ---------------------------------------------------------------- options

// CLI11 cannot know that a program and its arguments follow our options.
struct HelpFormatter : CLI::Formatter {
  std::string make_usage(const CLI::App*, std::string) const override {
    return "Usage: fsdpp-run [OPTIONS] [--] program [args...]\n";
  }
};

// "4" or "1:4" into the node counts; a message naming the value if it is neither.
std::string parse_nnodes(const std::string& text, Options& opt) {
  const std::string bad = "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got '" + text + "'";
  try {
    size_t used = 0;
    const auto colon = text.find(':');
    opt.min_nodes = std::stoi(text.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? text.size() : colon)) return bad;
    opt.max_nodes = colon == std::string::npos ? opt.min_nodes : std::stoi(text.substr(colon + 1), &used);
    if (colon != std::string::npos && used != text.size() - colon - 1) return bad;
  } catch (const std::exception&) {
    return bad;
  }
  if (opt.min_nodes < 1 || opt.max_nodes < opt.min_nodes) return bad;
  opt.nnodes = opt.max_nodes;
  return "";
}

// torchrun's --rdzv-conf: "key=value,...".
std::string parse_rdzv_conf(const std::string& text, Options& opt) {
  std::istringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    double number = -1;
    try {
      size_t used = 0;
      number = std::stod(value, &used);
      if (used != value.size()) number = -1;
    } catch (const std::exception&) {
    }
    if (!(number > 0 && number <= 1e7))
      return "--rdzv-conf " + key + " must be a positive number of seconds (or attempts), got '" + value + "'";
    if (key == "join_timeout") opt.join_timeout = number;
    else if (key == "last_call_timeout") opt.last_call_timeout = number;
    else if (key == "keep_alive_interval") opt.keep_alive_interval = number;
    else if (key == "keep_alive_max_attempt" && number == static_cast<int>(number))
      opt.keep_alive_max_attempt = static_cast<int>(number);
    else if (key == "keep_alive_max_attempt")
      return "--rdzv-conf keep_alive_max_attempt must be a whole number, got '" + value + "'";
    else return "--rdzv-conf has no key '" + key + "' (join_timeout, last_call_timeout, keep_alive_interval, "
                "keep_alive_max_attempt)";
  }
  return "";
}

// --rdzv-endpoint HOST:PORT ([::1]:PORT for IPv6) into its parts; a message if it is neither.
std::string parse_endpoint(Options& opt) {
  if (opt.rdzv_endpoint.empty()) return "";
  const std::optional<fsdpp::HostPort> endpoint = fsdpp::split_host_port(opt.rdzv_endpoint);
  if (!endpoint) return "--rdzv-endpoint must be HOST:PORT with a port in [1, 65535], got '" + opt.rdzv_endpoint + "'";
  opt.rdzv_host = endpoint->host;
  opt.rdzv_port = endpoint->port;
  return "";
}

// What --help says after the options.
constexpr const char* kHelpFooter =
      "Each process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT (= FSDPP_RESTART_COUNT),\n"
      "and OMP_NUM_THREADS=1 unless already set. Without --master-port, a single-node\n"
      "job's store listens on a free port of 127.0.0.1 that fsdpp-run holds and hands\n"
      "to rank 0 (FSDPP_STORE_LISTEN_FD; a program that is not built on fsdpp needs\n"
      "--master-port). Every\n"
      "line it prints is prefixed with \"[rank<R>]: \" (stdout and stderr kept apart).\n"
      "If a rank fails, the others get SIGTERM, then SIGKILL after the grace period,\n"
      "and fsdpp-run exits with the failing rank's exit code (128+signal if it was\n"
      "killed), unless --max-restarts allows a restart: then all ranks start again\n"
      "(a new attempt), except after a usage error (exit code 2), a program that\n"
      "cannot be executed (126, 127) or a preempted job (75). SIGINT and SIGTERM sent\n"
      "to fsdpp-run are forwarded to all ranks, which get --signal-grace-seconds to\n"
      "exit; fsdpp-run then exits with 75 if every rank exited with 75 (preempted:\n"
      "it saved its state, resume it), else with 128+signal. Ranks die with fsdpp-run.\n"
      "--timeout S sets FSDPP_TIMEOUT_SECONDS=S for the ranks: fsdpp's rendezvous and\n"
      "every collective then give up after S seconds, each waiting rank printing the\n"
      "collective and the ranks that had not arrived. When one rank has exited 0, the\n"
      "others get --exit-wait-seconds to follow; those still running then are named,\n"
      "and if one of them is stopped (SIGSTOP), or --exit-wait-seconds was given, the\n"
      "job is stopped with exit code 1 (otherwise fsdpp-run waits for ranks at work).\n"
      "With --rdzv-endpoint HOST:PORT (torchrun's c10d rendezvous) the launchers of\n"
      "all nodes meet at a store the launcher on HOST serves, and agree on node ranks\n"
      "and the world; with --nnodes MIN:MAX the job re-forms on at least MIN nodes when\n"
      "a node is lost, and admits a node waiting to join (the ranks get SIGTERM and\n"
      "--signal-grace-seconds to save first). FSDPP_STORE_SECRET (at least 16\n"
      "characters, the same on every node, never printed) puts the store's keys where\n"
      "only the job finds them.\n"
      "After a failure fsdpp-run prints a summary: each rank's fate, and whom\n"
      "timed-out ranks name as missing. When its stdout is a terminal, the ranks get\n"
      "FSDPP_STDOUT_IS_TERMINAL=1, and what a rank redraws with carriage returns (a\n"
      "progress bar) is shown as one status line under the log.";

// Returns the exit code if parsing ends the program (--help or a bad flag),
// or -1 to go on.
int parse_options(int argc, char** argv, Options& opt) {
  CLI::App app{"fsdpp-run: start one process per rank, torchrun style.", "fsdpp-run"};
  app.formatter(std::make_shared<HelpFormatter>());
  app.footer(kHelpFooter);
  // Everything from the program name on belongs to the program, not to us.
  app.prefix_command();
  app.add_option("--nproc-per-node,--nproc_per_node", opt.nproc_per_node,
                 "Processes (ranks) to start on this node")
      ->capture_default_str();
  std::string nnodes_text = "1";
  auto* nnodes = app.add_option("--nnodes", nnodes_text,
                                "Number of nodes in the job, or MIN:MAX for an elastic job (in an srun step: "
                                "SLURM_NNODES)")
                     ->capture_default_str();
  std::string rdzv_backend = "static", rdzv_conf;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", opt.rdzv_endpoint,
                 "HOST:PORT of the elastic rendezvous's store (torchrun's c10d backend), served by the launcher "
                 "on HOST; turns the elastic rendezvous on");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend,
                 "c10d (with --rdzv-endpoint) or static (--master-addr and --node-rank)")
      ->check(CLI::IsMember({"c10d", "static"}))
      ->capture_default_str();
  app.add_option("--rdzv-id,--rdzv_id", opt.rdzv_id, "The job's id in the rendezvous, the same on every node")
      ->capture_default_str();
  app.add_option("--rdzv-conf,--rdzv_conf", rdzv_conf,
                 "join_timeout=S,last_call_timeout=S,keep_alive_interval=S,keep_alive_max_attempt=N "
                 "(torchrun's; defaults 600, 30, 5, 3)");
  auto* node_rank = app.add_option("--node-rank,--node_rank", opt.node_rank,
                                   "Rank of this node, in [0, nnodes) (in an srun step: SLURM_NODEID)")
                        ->capture_default_str();
  auto* master_addr = app.add_option("--master-addr,--master_addr", opt.master_addr,
                                     "Address of the rank 0 node (MASTER_ADDR; in an srun step: the first host of "
                                     "SLURM_JOB_NODELIST)")
                          ->capture_default_str();
  auto* master_port = app.add_option("--master-port,--master_port", opt.master_port,
                                     "Port of the rendezvous store on the rank 0 node (MASTER_PORT); "
                                     "default for one node: a free port of 127.0.0.1; in a multi-node srun step: "
                                     "15000 + the last 4 digits of SLURM_JOB_ID")
                           ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", opt.max_restarts,
                 "Times the job's ranks are all started again after a failure")
      ->capture_default_str();
  app.add_option("--signal-grace-seconds,--signal_grace_seconds", opt.signal_grace_seconds,
                 "Seconds between a SIGINT/SIGTERM forwarded to the ranks and SIGKILL (time to save)")
      ->capture_default_str();
  app.add_option("--kill-grace-seconds,--kill_grace_seconds", opt.kill_grace_seconds,
                 "Seconds between SIGTERM and SIGKILL when stopping the ranks")
      ->capture_default_str();
  app.add_option("--timeout", opt.timeout_seconds,
                 "Seconds fsdpp's rendezvous and collectives wait (FSDPP_TIMEOUT_SECONDS); "
                 "default: the program's own (30 min unless it says otherwise)");
  auto* exit_wait = app.add_option("--exit-wait-seconds,--exit_wait_seconds", opt.exit_wait_seconds,
                                   "Once a rank has exited 0, seconds the others may take to exit before they "
                                   "are named; then stopped ranks (SIGSTOP) end the job, and when this option "
                                   "is given, any rank still running does")
                         ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  if (std::string error = parse_nnodes(nnodes_text, opt) + parse_rdzv_conf(rdzv_conf, opt) + parse_endpoint(opt);
      !error.empty()) {
    say(error);
    return kUsageError;
  }
  if (rdzv_backend == "c10d" && opt.rdzv_endpoint.empty()) {
    say("--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT");
    return kUsageError;
  }
  opt.exit_wait_given = exit_wait->count() > 0;
  opt.master_port_given = master_port->count() > 0;
  opt.nnodes_given = nnodes->count() > 0;
  opt.node_rank_given = node_rank->count() > 0;
  opt.master_addr_given = master_addr->count() > 0;
  // Unknown options land here too, ahead of the program; after "--" anything goes.
  opt.command = app.remaining();
  if (!opt.command.empty() && opt.command.front() == "--") {
    opt.command.erase(opt.command.begin());
  } else if (!opt.command.empty() && opt.command.front().rfind('-', 0) == 0) {
    say("unknown option '" + opt.command.front() + "' (see --help)");
    return kUsageError;
  }
  return -1;
}

// Returns a message naming the bad value, or "" if the options make sense.
std::string validate(const Options& o) {
  auto got = [](auto v) {
    std::ostringstream text;
    text << ", got " << v;
    return text.str();
  };
  if (o.command.empty()) return "no program given (see --help)";
  if (o.nproc_per_node < 1) return "--nproc-per-node must be at least 1" + got(o.nproc_per_node);
  if (o.nnodes < 1) return "--nnodes must be at least 1" + got(o.nnodes);
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > INT_MAX)
    return "--nnodes times --nproc-per-node is too large" + got(1LL * o.nnodes * o.nproc_per_node);
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return "--node-rank must be in [0, " + std::to_string(o.nnodes) + ") for --nnodes " +
           std::to_string(o.nnodes) + got(o.node_rank);
  if (o.master_port < 1 || o.master_port > 65535)
    return "--master-port must be in [1, 65535]" + got(o.master_port);
  if (o.master_addr.empty()) return "--master-addr must not be empty";
  if (!(o.kill_grace_seconds >= 0 && o.kill_grace_seconds <= 86400))  // also rejects NaN
    return "--kill-grace-seconds must be in [0, 86400]" + got(o.kill_grace_seconds);
  if (!(o.signal_grace_seconds >= 0 && o.signal_grace_seconds <= 86400))
    return "--signal-grace-seconds must be in [0, 86400]" + got(o.signal_grace_seconds);
  if (o.max_restarts < 0 || o.max_restarts > 1000000)
    return "--max-restarts must be in [0, 1000000]" + got(o.max_restarts);
  if (o.max_restarts > 0 && o.nnodes > 1 && !o.elastic())
    return "--max-restarts across " + std::to_string(o.nnodes) + " nodes needs the elastic rendezvous, where "
           "the launchers agree on each restart (--rdzv-endpoint HOST:PORT)";
  if (o.min_nodes != o.max_nodes && !o.elastic())
    return "--nnodes " + std::to_string(o.min_nodes) + ":" + std::to_string(o.max_nodes) +
           " needs the elastic rendezvous (--rdzv-endpoint HOST:PORT)";
  if (o.elastic() && o.node_rank_given)
    return "--node-rank is the rendezvous's to give in an elastic job (--rdzv-endpoint): drop it";
  if (!(o.timeout_seconds >= 0 && o.timeout_seconds <= 1e7))
    return "--timeout must be in [0, 1e7] seconds (0: the program's own)" + got(o.timeout_seconds);
  if (!(o.exit_wait_seconds >= 0 && o.exit_wait_seconds <= 1e7))
    return "--exit-wait-seconds must be in [0, 1e7]" + got(o.exit_wait_seconds);
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  fsdpp_run::block_signals_before_libraries(argv);
  Options opt;
  if (int code = parse_options(argc, argv, opt); code >= 0) return code;
  try {  // an elastic job's nodes come from its rendezvous
    if (std::string line = opt.elastic() ? "" : fsdpp_run::adopt_slurm_allocation(opt); !line.empty()) say(line);
  } catch (const std::exception& e) {
    say(e.what());
    return kUsageError;
  }
  if (std::string error = validate(opt); !error.empty()) {
    say(error);
    return kUsageError;
  }
  const std::string store = opt.elastic() ? opt.rdzv_endpoint : opt.master_addr + ":" + std::to_string(opt.master_port);
  if ((opt.elastic() || opt.nnodes > 1) && !std::getenv(fsdpp::kStoreSecretVariable) &&
      !fsdpp::is_loopback(opt.elastic() ? opt.rdzv_host : opt.master_addr))
    say("the job's store at " + store + " takes keys from anyone who reaches it: set " +
        fsdpp::kStoreSecretVariable + " to the same secret on every node (docs/api.md)");
  return fsdpp_run::run_job(opt);
}

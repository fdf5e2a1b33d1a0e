// fsdpp-run's elastic rendezvous with two launchers on one machine (the store on loopback):
// one world formed from both, a failed rank re-forming it, a failure past the budget ending
// every node, and the options it refuses. tests/multinode/elastic_nodes.sh runs it across
// network namespaces with real training.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "launcher_fixture.h"

namespace {

using namespace fsdpp_run_test;  // NOLINT: the fixture is this file's vocabulary

// Whether something accepts connections on 127.0.0.1:`port` within 10 s.
bool listening(int port) {
  const auto start = Clock::now();
  for (;;) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    if (connected) return true;
    if (seconds_since(start) > 10) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Whether `pid` blocks SIGTERM (to read it from its signal descriptor) within 20 s.
bool blocks_sigterm(pid_t pid) {
  const auto start = Clock::now();
  for (;;) {
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("SigBlk:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) >> (SIGTERM - 1) & 1)) return true;
    if (seconds_since(start) > 20) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

class ElasticLauncher : public Launcher {
 protected:
  // Flags for one of two launchers meeting at 127.0.0.1:`port`.
  static std::vector<std::string> node_flags(int port, std::vector<std::string> more = {}) {
    std::vector<std::string> flags{"--nproc-per-node", "2", "--nnodes", "2", "--rdzv-endpoint",
                                   "127.0.0.1:" + std::to_string(port), "--rdzv-id", "test",
                                   "--rdzv-conf", "join_timeout=20,last_call_timeout=1"};
    flags.insert(flags.end(), more.begin(), more.end());
    return flags;
  }
};

TEST_F(ElasticLauncher, TwoLaunchersFormOneWorld) {
  const std::string script = "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $TORCHELASTIC_USE_AGENT_STORE $MASTER_ADDR $MASTER_PORT\"";
  auto a = start(node_flags(29651), script);
  auto b = start(node_flags(29651), script);
  Outcome oa = a->finish(), ob = b->finish();
  ASSERT_EQ(oa.exit_code, 0) << oa.err;
  ASSERT_EQ(ob.exit_code, 0) << ob.err;
  std::vector<std::string> lines = lines_of(oa.out), more = lines_of(ob.out);
  lines.insert(lines.end(), more.begin(), more.end());
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank0]: 0 4 0 True 127.0.0.1 29651", "[rank1]: 1 4 1 True 127.0.0.1 29651",
                                             "[rank2]: 2 4 0 True 127.0.0.1 29651", "[rank3]: 3 4 1 True 127.0.0.1 29651"}))
      << oa.out << ob.out;
  EXPECT_TRUE(contains(oa.err + ob.err, "node 0 of 2, ranks 0-1 of a world of 4")) << oa.err << ob.err;
  EXPECT_TRUE(contains(oa.err + ob.err, "node 1 of 2, ranks 2-3 of a world of 4")) << oa.err << ob.err;
}

TEST_F(ElasticLauncher, FailedRankReformsTheWorldChargingOnlyItsNode) {
  // Round 0: a rank of launcher A fails; launcher B's ranks then fail too, as ranks do when a
  // peer is gone. Only A is charged: B, without restarts, still takes part in round 1.
  const std::string script =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then "
      "  if [ -n \"$FAIL\" ]; then [ \"$LOCAL_RANK\" = 1 ] && { sleep 0.5; touch \"$D/failed\"; exit 1; }; sleep 30; exit 9; fi; "
      "  until [ -e \"$D/failed\" ]; do sleep 0.02; done; sleep 1; exit 1; "
      "fi; echo \"round $TORCHELASTIC_RESTART_COUNT rank $RANK\"";
  auto a = start(node_flags(29652, {"--max-restarts", "1"}), script, {"FAIL=1"});
  auto b = start(node_flags(29652), script);
  Outcome oa = a->finish(), ob = b->finish();
  ASSERT_FALSE(oa.timed_out || ob.timed_out) << "A:\n" << oa.err << "B:\n" << ob.err;
  EXPECT_EQ(oa.exit_code, 0) << oa.err;
  EXPECT_EQ(ob.exit_code, 0) << ob.err;
  EXPECT_TRUE(contains(oa.err, "re-forming (restart 1 of 1 for this node)")) << oa.err;
  // B saw the round end either before its ranks failed or after ("had ended when"): no restart
  // charged, or B, which has none, would have ended the job.
  EXPECT_FALSE(contains(ob.err, "re-forming (restart")) << ob.err;
  EXPECT_TRUE(contains(ob.err, "rendezvous round 1 at")) << ob.err;
  const std::string out = oa.out + ob.out;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(contains(out, "round 1 rank " + std::to_string(rank))) << out;
  EXPECT_LT(std::max(oa.seconds, ob.seconds), 15);  // the sleeping ranks were stopped, not waited for
}

TEST_F(ElasticLauncher, PreemptedNodesAllExitPreempted) {
  // srun's SIGTERM reaches every launcher; the ranks save (exit 75), and no node calls the job failed.
  const std::string script = "trap 'exit 75' TERM; " + publish("up", "$$") + "sleep 30 & wait";
  auto a = start(node_flags(29655), script);
  auto b = start(node_flags(29655), script);
  ASSERT_TRUE(wait_for("up", {0, 1, 2, 3}));
  kill(a->pid(), SIGTERM);
  kill(b->pid(), SIGTERM);
  Outcome oa = a->finish(), ob = b->finish();
  EXPECT_EQ(oa.exit_code, 75) << oa.err;
  EXPECT_EQ(ob.exit_code, 75) << ob.err;
  EXPECT_FALSE(contains(oa.err + ob.err, "failed")) << oa.err << ob.err;
}

TEST_F(ElasticLauncher, FailurePastTheBudgetEndsEveryNode) {
  const std::string script = "[ \"$RANK\" = 3 ] && { sleep 0.5; exit 7; }; sleep 30";
  auto a = start(node_flags(29653), script);
  auto b = start(node_flags(29653), script);
  Outcome oa = a->finish(), ob = b->finish();
  ASSERT_FALSE(oa.timed_out || ob.timed_out) << "A:\n" << oa.err << "B:\n" << ob.err;
  const Outcome& failed = contains(oa.err, "ranks 2-3") ? oa : ob;
  const Outcome& other = &failed == &oa ? ob : oa;
  EXPECT_EQ(failed.exit_code, 7) << failed.err;
  EXPECT_TRUE(contains(failed.err, "not restarted: no restarts left (--max-restarts 0)")) << failed.err;
  EXPECT_EQ(other.exit_code, 1) << other.err;
  EXPECT_TRUE(contains(other.err, "the job failed on another node: node 1: rank 3 (pid")) << other.err;
  EXPECT_LT(std::max(oa.seconds, ob.seconds), 15);
}

TEST_F(ElasticLauncher, LostHeartbeatReformsWithoutTheNode) {
  // B's launcher stops (SIGSTOP: its ranks sleep on, nothing fails); A, serving the store, misses
  // its heartbeat for 1 s x 3 and re-forms alone (--nnodes 1:2). Shorter, a loaded machine's
  // launcher can miss its own beats while its ranks start.
  const std::string script = "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && { " + publish("up", "$$") +
                             "sleep 30; exit 9; }; echo \"round $TORCHELASTIC_RESTART_COUNT rank $RANK of $WORLD_SIZE\"";
  std::vector<std::string> flags = node_flags(29656);
  flags[3] = "1:2";
  // last_call_timeout 5: B, started second, makes round 0 even when libtorch loads slowly.
  flags.back() = "join_timeout=30,last_call_timeout=5,keep_alive_interval=1,keep_alive_max_attempt=3";
  auto a = start(flags, script);
  ASSERT_TRUE(listening(29656));  // A serves the store
  auto b = start(flags, script);
  ASSERT_TRUE(wait_for("up", {0, 1, 2, 3}));
  kill(b->pid(), SIGSTOP);
  Outcome oa = a->finish();
  kill(b->pid(), SIGKILL);
  EXPECT_EQ(oa.exit_code, 0) << oa.err;
  EXPECT_TRUE(contains(oa.err, "node 1 of rendezvous round 0 was lost (no heartbeat for 3 s)")) << oa.err;
  EXPECT_TRUE(contains(oa.out, "round 1 rank 0 of 2")) << oa.out;
  EXPECT_LT(oa.seconds, 25);
}

TEST_F(ElasticLauncher, TooFewNodesTimeOutNamingTheCount) {
  std::vector<std::string> flags = node_flags(29657);
  flags.back() = "join_timeout=1";
  Outcome o = run(flags, "exit 0");
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_TRUE(contains(o.err, "no rendezvous at 127.0.0.1:29657 within join_timeout 1 s: 1 of at least 2 nodes "
                              "joined round 0")) << o.err;
}

TEST_F(ElasticLauncher, RefusesNodesWithDifferentRankCounts) {
  std::vector<std::string> one = node_flags(29658);
  one[1] = "1";
  auto a = start(node_flags(29658), "exit 0");
  auto b = start(one, "exit 0");
  Outcome oa = a->finish(), ob = b->finish();
  EXPECT_EQ(oa.exit_code, 2) << oa.err;
  EXPECT_EQ(ob.exit_code, 2) << ob.err;
  EXPECT_TRUE(contains(oa.err + ob.err, "every node of an elastic job needs the same --nproc-per-node")) << oa.err;
}

TEST_F(ElasticLauncher, StopsWhileWaitingForTheStoresHost) {
  // The port taken here but not served: the launcher cannot serve the store and waits for
  // whoever should, and SIGTERM ends the wait.
  const int taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(29659);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto launcher = start(node_flags(29659), "touch \"$D/ran.$RANK\"");
  ASSERT_TRUE(blocks_sigterm(launcher->pid()));  // it takes signals itself now (libtorch loads slowly)
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(launcher->pid(), SIGTERM);
  Outcome o = launcher->finish();
  EXPECT_EQ(o.exit_code, 128 + SIGTERM) << o.err;
  EXPECT_TRUE(contains(o.err, "fsdpp-run received SIGTERM while waiting for the rendezvous")) << o.err;
  EXPECT_LT(o.seconds, 5);
  EXPECT_TRUE(fs::is_empty(dir_));
  close(taken);
}

TEST_F(ElasticLauncher, RefusesWhatTheRendezvousCannotDo) {
  const std::string endpoint = "127.0.0.1:29654";
  struct Case {
    std::vector<std::string> flags;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {{"--nnodes", "2:1", "--rdzv-endpoint", endpoint}, "--nnodes must be N or MIN:MAX with 1 <= MIN <= MAX, got '2:1'"},
           {{"--nnodes", "two"}, "got 'two'"},
           {{"--nnodes", "1:2"}, "--nnodes 1:2 needs the elastic rendezvous (--rdzv-endpoint HOST:PORT)"},
           {{"--nnodes", "2", "--max-restarts", "1"}, "--max-restarts across 2 nodes needs the elastic rendezvous"},
           {{"--rdzv-endpoint", "127.0.0.1"}, "--rdzv-endpoint must be HOST:PORT"},
           {{"--rdzv-endpoint", "127.0.0.1:0"}, "--rdzv-endpoint must be HOST:PORT"},
           {{"--rdzv-backend", "c10d"}, "--rdzv-backend c10d needs --rdzv-endpoint"},
           {{"--rdzv-endpoint", endpoint, "--rdzv-conf", "join_timeout=soon"}, "join_timeout must be a positive"},
           {{"--rdzv-endpoint", endpoint, "--rdzv-conf", "patience=3"}, "--rdzv-conf has no key 'patience'"},
           {{"--rdzv-endpoint", endpoint, "--nnodes", "2", "--node-rank", "1"}, "--node-rank is the rendezvous's"},
       }) {
    Outcome o = run_refused(c.flags);
    EXPECT_EQ(o.exit_code, 2) << ::testing::PrintToString(c.flags);
    EXPECT_TRUE(contains(o.err, c.says)) << o.err;
  }
  // A secret too short to be one: named, its value never printed.
  Outcome o = run_refused({"--rdzv-endpoint", endpoint}, {"FSDPP_STORE_SECRET=hunter2"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "FSDPP_STORE_SECRET has 7 characters; a secret needs at least 16")) << o.err;
  EXPECT_FALSE(contains(o.err, "hunter2")) << o.err;
}

}  // namespace

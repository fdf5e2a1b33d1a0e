// Tests of fsdpp-run. Each test runs the real launcher binary with a small
// `sh -c` program as the ranks, under a deadline so nothing can hang, and
// checks exit codes, output, and that no process is left behind.

#include "launcher_fixture.h"

namespace {

using namespace fsdpp_run_test;  // NOLINT: the fixture is this file's vocabulary

// ---------------------------------------------------------------- environment

TEST_F(Launcher, SetsTorchrunEnvironment) {
  Outcome o = run({"--nproc-per-node", "3", "--master-port", "29611"},
                  "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK "
                  "$MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS\"");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  auto lines = lines_of(o.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank0]: 0 3 0 3 0 127.0.0.1 29611 1",
                                             "[rank1]: 1 3 1 3 0 127.0.0.1 29611 1",
                                             "[rank2]: 2 3 2 3 0 127.0.0.1 29611 1"}));
}

TEST_F(Launcher, MultiNodeRanksAndTorchrunSpellings) {
  Outcome o = run({"--nproc_per_node=3", "--nnodes", "2", "--node_rank", "1", "--master_addr",
                   "10.1.2.3", "--"},
                  "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  auto lines = lines_of(o.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank3]: 3 6 0 1 10.1.2.3 29500",
                                             "[rank4]: 4 6 1 1 10.1.2.3 29500",
                                             "[rank5]: 5 6 2 1 10.1.2.3 29500"}));
}

TEST_F(Launcher, KeepsOmpNumThreadsIfSet) {
  Outcome o = run({"--nproc-per-node", "1"}, "echo $OMP_NUM_THREADS", {"OMP_NUM_THREADS=4"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[rank0]: 4\n");
}

TEST_F(Launcher, PassesProgramArgumentsThrough) {
  // Everything after the program belongs to it, even options we also have.
  Outcome o = Launched({FSDPP_RUN_PATH, "sh", "-c", "echo \"$1 $2\"", "x", "--nproc-per-node", "5"},
                       {})
                  .finish();
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[rank0]: --nproc-per-node 5\n");
}

// ---------------------------------------------------------------- output

TEST_F(Launcher, PartialLastLineAndStderrKeepTheirPrefix) {
  Outcome o = run({"--nproc-per-node", "1"},
                  "printf 'one\\ntwo'; printf 'oops\\nhalf' >&2");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.out, "[rank0]: one\n[rank0]: two\n");
  EXPECT_EQ(o.err, "[rank0]: oops\n[rank0]: half\n");
}

TEST_F(Launcher, VeryLongLinesStayWhole) {
  Outcome o = run({"--nproc-per-node", "2"},
                  "head -c 300000 /dev/zero | tr '\\0' \"$RANK\"; echo");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  auto lines = lines_of(o.out);
  std::sort(lines.begin(), lines.end());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "[rank0]: " + std::string(300000, '0'));
  EXPECT_EQ(lines[1], "[rank1]: " + std::string(300000, '1'));
}

// What a terminal shows after `bytes`: "\r" returns to the start of the line, "\033[K" erases
// to its end, "\n" starts a new line (a pseudo-terminal writes "\r\n").
std::vector<std::string> screen_of(const std::string& bytes) {
  std::vector<std::string> lines{""};
  size_t column = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string& line = lines.back();
    if (bytes[i] == '\r') {
      column = 0;
    } else if (bytes[i] == '\n') {
      lines.emplace_back();
      column = 0;
    } else if (bytes.compare(i, 3, "\033[K") == 0) {
      line.resize(column);
      i += 2;
    } else {
      if (column < line.size())
        line[column] = bytes[i];
      else
        line += bytes[i];
      ++column;
    }
  }
  return lines;
}

// A progress bar redrawn with carriage returns, a log line in between, the bar erased at the end.
const char* kProgressBarRank =
    "[ \"$FSDPP_STDOUT_IS_TERMINAL\" = 1 ] || { echo \"not told: '$FSDPP_STDOUT_IS_TERMINAL'\"; exit 3; }; "
    "printf '\\r\\033[K[#..] 1/3'; sleep 0.3; printf '\\r\\033[K[##.] 2/3'; sleep 0.3; "
    "printf '\\r\\033[Kstep 2 done\\n'; printf '\\r\\033[K[###] 3/3'; sleep 0.3; "
    "echo warning >&2; sleep 0.3; printf '\\r\\033[K'; echo finished";

TEST_F(Launcher, OnATerminalCarriageReturnRedrawsAreOneStatusLine) {
  Outcome o = Launched({FSDPP_RUN_PATH, "--nproc-per-node", "1", "sh", "-c", kProgressBarRank}, {},
                       Stdout::kTerminal)
                  .finish();
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.out << o.err;
  // Each redraw replaced the status line; the log lines are whole, without bar remnants.
  EXPECT_TRUE(contains(o.out, "\r\033[K[rank0]: [##.] 2/3")) << ::testing::PrintToString(o.out);
  EXPECT_TRUE(contains(o.out, "\r\033[K[rank0]: [###] 3/3")) << ::testing::PrintToString(o.out);
  EXPECT_FALSE(contains(o.out, "[rank0]: \r")) << ::testing::PrintToString(o.out);
  EXPECT_EQ(screen_of(o.out), (std::vector<std::string>{"[rank0]: step 2 done", "[rank0]: finished", ""}))
      << ::testing::PrintToString(o.out);
  EXPECT_EQ(o.err, "[rank0]: warning\n");
}

TEST_F(Launcher, OnATerminalARankDyingMidRedrawLeavesItsLastStatusAsALine) {
  Outcome o = Launched({FSDPP_RUN_PATH, "--nproc-per-node", "1", "sh", "-c",
                        "printf 'log\\n\\r[#..] 1/3'; sleep 0.2; printf '\\r[##.] 2/3'; exit 4"},
                       {}, Stdout::kTerminal)
                  .finish();
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_EQ(screen_of(o.out), (std::vector<std::string>{"[rank0]: log", "[rank0]: [##.] 2/3", ""}))
      << ::testing::PrintToString(o.out);
}

TEST_F(Launcher, OnAPipeRanksAreNotToldOfATerminalAndBytesPassAsWritten) {
  // Also when fsdpp-run itself was told so by an outer launcher.
  Outcome o = run({"--nproc-per-node", "1"}, "echo \"${FSDPP_STDOUT_IS_TERMINAL:-unset}\"; printf 'a\\rb\\n'",
                  {"FSDPP_STDOUT_IS_TERMINAL=1"});
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out, "[rank0]: unset\n[rank0]: a\rb\n");
}

// ---------------------------------------------------------------- failures

TEST_F(Launcher, FailingRankStopsTheOthers) {
  // Rank 1 fails once the others are up; they would sleep for a minute.
  auto script = publish("pid", "$$") + "if [ $RANK = 1 ]; then " + await("pid", {0, 2}) +
                "exit 7; fi; exec sleep 60";
  Outcome o = run({"--nproc-per-node", "3"}, script);
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 7);
  EXPECT_LT(o.seconds, 10);
  EXPECT_TRUE(contains(o.err, "rank 1")) << o.err;
  EXPECT_TRUE(contains(o.err, "exited with code 7")) << o.err;
  EXPECT_EQ(survivors(pids("pid", {0, 1, 2})), std::vector<pid_t>{});
}

TEST_F(Launcher, RankKilledBySignalGives128PlusSignal) {
  auto script = publish("pid", "$$") + "if [ $RANK = 0 ]; then " + await("pid", {1}) +
                "kill -KILL $$; fi; exec sleep 60";
  Outcome o = run({"--nproc-per-node", "2"}, script);
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(contains(o.err, "rank 0")) << o.err;
  EXPECT_TRUE(contains(o.err, "SIGKILL")) << o.err;
  EXPECT_EQ(survivors(pids("pid", {0, 1})), std::vector<pid_t>{});
}

TEST_F(Launcher, EscalatesToSigkillWhenSigtermIsIgnored) {
  auto script = "if [ $RANK = 1 ]; then " + await("pid", {0}) + "exit 5; fi; trap '' TERM; " +
                publish("pid", "$$") + "exec sleep 60";
  Outcome o = run({"--nproc-per-node", "2", "--kill-grace-seconds", "1"}, script);
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 5);
  EXPECT_GE(o.seconds, 1.0);  // the grace period was granted...
  EXPECT_LT(o.seconds, 10);   // ...and then cut short
  EXPECT_TRUE(contains(o.err, "SIGKILL")) << o.err;
  EXPECT_EQ(survivors(pids("pid", {0})), std::vector<pid_t>{});
}

TEST_F(Launcher, KillsGrandchildrenOfAFailedJob) {
  auto script = "sleep 60 & " + publish("gc", "$!") + "if [ $RANK = 1 ]; then " +
                await("gc", {0, 2}) + "exit 4; fi; wait";
  Outcome o = run({"--nproc-per-node", "3"}, script);
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 4);
  EXPECT_LT(o.seconds, 10);
  EXPECT_EQ(survivors(pids("gc", {0, 1, 2})), std::vector<pid_t>{});
}

TEST_F(Launcher, KillsGrandchildrenLeftBySuccessfulRanks) {
  Outcome o = run({"--nproc-per-node", "2"}, "sleep 60 & " + publish("gc", "$!") + "exit 0");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_LT(o.seconds, 10);
  EXPECT_EQ(survivors(pids("gc", {0, 1})), std::vector<pid_t>{});
}

// ---------------------------------------------------------------- signals

TEST_F(Launcher, ForwardsSigtermToRanks) { check_forwarded(SIGTERM, "TERM"); }

TEST_F(Launcher, ForwardsSigintToRanks) { check_forwarded(SIGINT, "INT"); }

TEST_F(Launcher, RanksDieWhenLauncherIsKilled) {
  auto launcher = start({"--nproc-per-node", "2"}, publish("pid", "$$") + "exec sleep 60");
  ASSERT_TRUE(wait_for("pid", {0, 1}));
  kill(launcher->pid(), SIGKILL);  // no chance to clean up: PR_SET_PDEATHSIG must do it
  Outcome o = launcher->finish();
  EXPECT_EQ(o.exit_code, 128 + SIGKILL);
  EXPECT_EQ(survivors(pids("pid", {0, 1}), 2.0), std::vector<pid_t>{});
}

// ---------------------------------------------------------------- restarts

// Occurrences of `part` in `text`.
int count_of(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST_F(Launcher, RestartsAllRanksAfterAFailure) {
  // Attempt 0: rank 1 fails once rank 0 is up. Attempt 1: both succeed.
  auto script = "echo \"attempt $TORCHELASTIC_RESTART_COUNT $FSDPP_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS\"; " +
                publish("pid$FSDPP_RESTART_COUNT", "$$") +
                "if [ $FSDPP_RESTART_COUNT = 0 ]; then if [ $RANK = 1 ]; then " + await("pid0", {0}) +
                "exit 3; fi; exec sleep 60; fi; exit 0";
  Outcome o = run({"--nproc-per-node", "2", "--max-restarts", "2"}, script);
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(count_of(o.out, "attempt 0 0 of 2"), 2) << o.out;
  EXPECT_EQ(count_of(o.out, "attempt 1 1 of 2"), 2) << o.out;
  EXPECT_EQ(count_of(o.out, "attempt 2"), 0) << o.out;
  EXPECT_TRUE(contains(o.err, "attempt 1 of 3 ended (rank 1 (pid ")) << o.err;
  EXPECT_TRUE(contains(o.err, "exited with code 3); restarting all ranks (restart 1 of 2)")) << o.err;
  EXPECT_TRUE(contains(o.err, "summary: attempt 2 of 3: all ranks exited with code 0 (exit code 0)")) << o.err;
  // Attempt 0's sleeping rank 0 was stopped before attempt 1 began.
  EXPECT_EQ(survivors(pids("pid0", {0, 1}), 0), std::vector<pid_t>{});
}

TEST_F(Launcher, SpentRestartBudgetEndsWithTheLastFailureAndAnAccountOfEveryAttempt) {
  Outcome o = run({"--nproc-per-node", "2", "--max-restarts", "2"},
                  "if [ $RANK = 0 ]; then exit $((10 + FSDPP_RESTART_COUNT)); fi; exec sleep 60");
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 12) << o.err;
  EXPECT_TRUE(contains(o.err, "not restarted: no restarts left (--max-restarts 2)")) << o.err;
  for (const char* line : {"summary: attempt 1 of 3: rank 0 (pid ", "exited with code 10 (exit code 10)",
                           "summary: attempt 2 of 3: rank 0 (pid ", "exited with code 11 (exit code 11)",
                           "summary: attempt 3 of 3: rank 0 (pid ", "exited with code 12 (exit code 12)"})
    EXPECT_TRUE(contains(o.err, line)) << line << " missing from:\n" << o.err;
}

TEST_F(Launcher, UsageErrorsAndPreemptedRanksAreNotRestarted) {
  Outcome usage = run({"--nproc-per-node", "2", "--max-restarts", "3"},
                      "echo ran; " + publish("ran", "1") + "if [ $RANK = 1 ]; then " + await("ran", {0}) +
                          "exit 2; fi; exec sleep 60");
  ASSERT_FALSE(usage.timed_out);
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(count_of(usage.out, "]: ran\n"), 2) << usage.out;  // one attempt only
  EXPECT_TRUE(contains(usage.err, "not restarted: exit code 2 is a usage error")) << usage.err;

  // A rank preempted on its own (srun signals every task) saved its state: the others get the
  // signal grace to do the same, and the job ends with the preempted code, unrestarted.
  const std::string saver = "echo ran; " + publish("up", "1") + "if [ $RANK = 1 ]; then " + await("up", {0}) +
                            "exit 75; fi; sleep 0.5; exit 75";
  Outcome preempted = run({"--nproc-per-node", "2", "--max-restarts", "3"}, saver);
  ASSERT_FALSE(preempted.timed_out);
  EXPECT_EQ(preempted.exit_code, 75) << preempted.err;
  EXPECT_EQ(count_of(preempted.out, "]: ran\n"), 2) << preempted.out;
  EXPECT_TRUE(contains(preempted.err, "the other ranks get 30 s to do the same")) << preempted.err;
  EXPECT_FALSE(contains(preempted.err, "SIGKILL")) << preempted.err;
  // One that does not save (SIGKILLed at the end of the grace) makes the job a failure, not
  // "resume me".
  fs::remove(file("up", 0)), fs::remove(file("up", 1));
  Outcome half = run({"--nproc-per-node", "2", "--signal-grace-seconds", "1"},
                     publish("up", "1") + "if [ $RANK = 1 ]; then " + await("up", {0}) + "exit 75; fi; exec sleep 60");
  ASSERT_FALSE(half.timed_out);
  EXPECT_EQ(half.exit_code, 128 + SIGKILL) << half.err;
}

TEST_F(Launcher, SigtermGivesRanksTheSignalGraceAndPreemptedRanksGiveCode75) {
  // Each rank takes a second to "save" after SIGTERM, longer than --kill-grace-seconds.
  auto script = "trap 'sleep 1; exit 75' TERM; sleep 60 & " + publish("pid", "$$") + "wait; exit 1";
  auto launcher = start({"--nproc-per-node", "2", "--kill-grace-seconds", "0.2", "--max-restarts", "1"}, script);
  ASSERT_TRUE(wait_for("pid", {0, 1}));
  kill(launcher->pid(), SIGTERM);
  Outcome o = launcher->finish();
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 75) << o.err;
  EXPECT_TRUE(contains(o.err, "forwarding it to all ranks (SIGKILL in 30 s)")) << o.err;
  EXPECT_TRUE(contains(o.err, "not restarted: fsdpp-run was told to stop")) << o.err;
}

TEST_F(Launcher, SingleNodeStoreListensOnAFreeLoopbackPortHandedToRankZero) {
  // Rank 0 holds the launcher's listening socket; /proc/net/tcp shows it bound to 127.0.0.1
  // (0100007F) and listening (state 0A).
  auto script = std::string("if [ $RANK = 0 ]; then [ -n \"$FSDPP_STORE_LISTEN_FD\" ] && ") +
                "readlink /proc/$$/fd/$FSDPP_STORE_LISTEN_FD | grep -q '^socket:' && echo fd; " +
                "grep -i \" 0100007F:$(printf %04X $MASTER_PORT) 00000000:0000 0A \" /proc/net/tcp >/dev/null && "
                "echo loopback; else echo \"fd=${FSDPP_STORE_LISTEN_FD:-none}\"; fi; echo port=$MASTER_PORT";
  auto first = start({"--nproc-per-node", "2"}, script + "; sleep 0.5");
  auto second = start({"--nproc-per-node", "2"}, script);
  Outcome a = first->finish(), b = second->finish();
  for (const Outcome* o : {&a, &b}) {
    ASSERT_FALSE(o->timed_out);
    EXPECT_EQ(o->exit_code, 0) << o->err;
    EXPECT_TRUE(contains(o->out, "[rank0]: fd\n")) << o->out;
    EXPECT_TRUE(contains(o->out, "[rank0]: loopback\n")) << o->out;
    EXPECT_TRUE(contains(o->out, "[rank1]: fd=none\n")) << o->out;
    EXPECT_FALSE(contains(o->out, "port=29500")) << o->out;
  }
  const auto port_of = [](const std::string& out) { return out.substr(out.find("[rank0]: port=")); };
  EXPECT_NE(port_of(a.out).substr(0, 20), port_of(b.out).substr(0, 20)) << "two jobs at once share a port";
}

// ---------------------------------------------------------------- Slurm

// What srun sets for one task per node of a two-node step (node 1's task here).
std::vector<std::string> slurm_step_env(const std::string& ntasks = "2") {
  return {"SLURM_JOB_ID=123456", "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=node[07-08]", "SLURM_NNODES=2",
          "SLURM_NODEID=1", "SLURM_NTASKS=" + ntasks, "SLURM_PROCID=1", "SLURM_LOCALID=0"};
}

TEST_F(Launcher, InAnSrunStepTheJobComesFromSlurm) {
  Outcome o = run({"--nproc-per-node", "2"}, "echo \"$RANK $WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT\"",
                  slurm_step_env());
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  auto lines = lines_of(o.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank2]: 2 4 1 node07 18456", "[rank3]: 3 4 1 node07 18456"}));
  EXPECT_TRUE(contains(o.err, "Slurm job 123456: node 1 of 2, the store at node07:18456")) << o.err;
  // A one-node step meets on loopback, on the launcher's own port.
  Outcome one = run({"--nproc-per-node", "2"}, "echo \"$WORLD_SIZE $MASTER_ADDR ${FSDPP_STORE_LISTEN_FD:+fd}\"",
                    {"SLURM_JOB_ID=123456", "SLURM_STEP_ID=0", "SLURM_JOB_NODELIST=node07", "SLURM_NNODES=1",
                     "SLURM_NODEID=0", "SLURM_NTASKS=1"});
  auto one_lines = lines_of(one.out);
  std::sort(one_lines.begin(), one_lines.end());
  EXPECT_EQ(one_lines, (std::vector<std::string>{"[rank0]: 2 127.0.0.1 fd", "[rank1]: 2 127.0.0.1 "})) << one.err;
  EXPECT_TRUE(contains(one.err, "Slurm job 123456: one node")) << one.err;
  // The user's flags rule: --nnodes 1 is a single-node job on each node.
  Outcome own = run({"--nproc-per-node", "1", "--nnodes", "1"}, "echo $WORLD_SIZE $MASTER_ADDR", slurm_step_env());
  EXPECT_EQ(own.out, "[rank0]: 1 127.0.0.1\n") << own.err;
}

TEST_F(Launcher, SlurmMisuseIsNamed) {
  Outcome per_rank = run_refused({"--nproc-per-node", "2"}, slurm_step_env("4"));
  EXPECT_EQ(per_rank.exit_code, 2);
  EXPECT_TRUE(contains(per_rank.err, "this Slurm step runs 4 tasks on 2 nodes")) << per_rank.err;
  std::vector<std::string> batch = slurm_step_env();
  batch.erase(batch.begin() + 1);  // no SLURM_STEP_ID: the batch script itself
  Outcome in_batch = run_refused({"--nproc-per-node", "2"}, batch);
  EXPECT_EQ(in_batch.exit_code, 2);
  EXPECT_TRUE(contains(in_batch.err, "srun --ntasks-per-node=1 fsdpp-run")) << in_batch.err;
  std::vector<std::string> broken = slurm_step_env();
  broken[2] = "SLURM_JOB_NODELIST=node[07-";
  Outcome bad_list = run_refused({"--nproc-per-node", "2"}, broken);
  EXPECT_EQ(bad_list.exit_code, 2);
  EXPECT_TRUE(contains(bad_list.err, "SLURM_JOB_NODELIST='node[07-' is not a Slurm host list")) << bad_list.err;
}

// ---------------------------------------------------------------- bad input

TEST_F(Launcher, MissingProgramIsNamed) {
  std::vector<std::string> args{FSDPP_RUN_PATH, "--nproc-per-node", "2", "fsdpp-no-such-program"};
  Outcome o = Launched(args, {}).finish();
  ASSERT_FALSE(o.timed_out);
  EXPECT_EQ(o.exit_code, 127);  // the shell's "command not found"
  EXPECT_TRUE(contains(o.err, "cannot execute 'fsdpp-no-such-program': No such file or directory"))
      << o.err;
}

TEST_F(Launcher, RejectsZeroProcesses) {
  Outcome o = run_refused({"--nproc-per-node", "0"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--nproc-per-node must be at least 1, got 0")) << o.err;
}

TEST_F(Launcher, RejectsNodeRankOutsideNnodes) {
  Outcome o = run_refused({"--nnodes", "2", "--node-rank", "2"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--node-rank")) << o.err;
  EXPECT_TRUE(contains(o.err, "got 2")) << o.err;
}

TEST_F(Launcher, RejectsInvalidPort) {
  Outcome o = run_refused({"--master-port", "70000"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--master-port")) << o.err;
  EXPECT_TRUE(contains(o.err, "70000")) << o.err;
  Outcome p = run_refused({"--master-port", "http"});
  EXPECT_EQ(p.exit_code, 2);
  EXPECT_TRUE(contains(p.err, "http")) << p.err;
}

TEST_F(Launcher, RejectsUnknownOption) {
  Outcome o = run_refused({"--nproc-per-nod", "2"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_TRUE(contains(o.err, "--nproc-per-nod")) << o.err;
}

TEST_F(Launcher, HelpDocumentsEveryOption) {
  Outcome o = Launched({FSDPP_RUN_PATH, "--help"}, {}).finish();
  EXPECT_EQ(o.exit_code, 0);
  for (const char* flag : {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                           "--master-port", "--kill-grace-seconds", "--nproc_per_node", "--max-restarts",
                           "--signal-grace-seconds", "TORCHELASTIC_RESTART_COUNT", "--rdzv-endpoint",
                           "--rdzv-id", "--rdzv-conf", "--rdzv-backend", "FSDPP_STORE_SECRET"})
    EXPECT_TRUE(contains(o.out, flag)) << flag << " missing from:\n" << o.out;
}

}  // namespace

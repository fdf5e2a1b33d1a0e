// Submitting a collective to its group's comm thread, and tracing it (comm/collective_submission.h):
// numbering, CommDebugMode's byte count, the profiler's issue / run records, the intent check
// before the exchange, and turning a timeout into a report of who is missing.
#include "comm/collective_submission.h"

#include <cstdio>
#include <exception>
#include <mutex>
#include <utility>

#include <fsdpp/comm_debug_mode.h>
#include <fsdpp/error.h>

#include "comm/comm_thread.h"
#include "comm/error_message.h"
#include "comm/hang_report.h"
#include "comm/process_group_impl.h"
#include "profiler/timeline.h"

namespace fsdpp::detail {
namespace {

// The profiler's view of a collective: issued on the caller's thread (inside its innermost
// record_function), then run on the group's comm thread (or launched on the caller's).
struct TraceIssue {
  long long at_us = -1;  // -1: not recording when issued
  std::string in;
};

TraceIssue trace_issue(const std::string& name, const std::string& description) {
  TraceIssue issue{profiler::detail::now_us(), profiler::detail::current_span()};
  profiler::detail::record({"issue " + name, "collective", issue.at_us, -1, {{"collective", description}, {"in", issue.in}}});
  return issue;
}

// A span of the comm thread's track (the issuing thread's, for a launch there), from the start
// of the run to its end (or failure).
class TraceRun {
 public:
  TraceRun(const ProcessGroupImpl& g, const std::string& name, const std::string& description, const TraceIssue& issue,
           int64_t bytes_sent, bool on_comm_thread)
      : name_(name), description_(description), issue_(issue), bytes_sent_(bytes_sent) {
    if (!profiler::detail::recording()) return;
    start_us_ = profiler::detail::now_us();
    if (on_comm_thread) profiler::detail::name_this_thread("comm thread of group " + g.name);
  }
  ~TraceRun() {
    if (start_us_ < 0) return;
    std::vector<std::pair<std::string, std::string>> args{{"collective", description_},
                                                          {"bytes sent", std::to_string(bytes_sent_)}};
    if (issue_.at_us >= 0) {
      args.emplace_back("issued in", issue_.in);
      args.emplace_back("queued us", std::to_string(start_us_ - issue_.at_us));
    }
    if (std::uncaught_exceptions() > 0) args.emplace_back("failed", "yes");
    profiler::detail::record({name_, "collective", start_us_, profiler::detail::now_us() - start_us_, std::move(args)});
  }
  TraceRun(const TraceRun&) = delete;
  TraceRun& operator=(const TraceRun&) = delete;

 private:
  const std::string& name_;
  const std::string& description_;
  const TraceIssue& issue_;
  int64_t bytes_sent_;
  long long start_us_ = -1;
};

// Runs `body` (the intent check, the exchange) of collective `seq` of `g`, turning a wait that
// timed out (here or at a peer) into a report of who is missing.
void reporting_hangs(const ProcessGroupImpl& g, int64_t seq, const std::string& description,
                     const std::function<void()>& body) {
  try {
    body();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    const bool own_timeout = is_timeout(e);
    if (g.failed.exchange(true)) {  // an earlier collective of this group already failed here
      if (!own_timeout) throw;
      throw Error(description + " failed: timed out after an earlier collective of " + g.where() + " failed");
    }
    if (!own_timeout && !peer_timed_out(g, seq)) throw;
    // Say who is missing, not just that the wait ended (and without c10's backtrace).
    throw Error(description + " failed: " + report_hang(g, seq, description, own_timeout));
  }
}

// Counts into CommDebugMode what a collective known only at its end sent, when its run ends
// (failed or not).
class CountAtEnd {
 public:
  CountAtEnd(CollectiveKind kind, const std::function<int64_t()>& bytes) : kind_(kind), bytes_(bytes) {}
  ~CountAtEnd() {
    if (bytes_) CommDebugMode::record(collective_name(kind_), bytes_());
  }
  CountAtEnd(const CountAtEnd&) = delete;
  CountAtEnd& operator=(const CountAtEnd&) = delete;

 private:
  CollectiveKind kind_;
  const std::function<int64_t()>& bytes_;
};

}  // namespace

// Numbering and counting happen in the caller's thread, so they follow issue order.
Work submit(const ProcessGroupImpl& g, CollectiveKind kind, CollectiveIntent intent, SentBytes sent,
            const std::string& what, bool async_op, std::function<void()> run, Work after,
            DeviceHandoff handoff) {
  const int64_t seq = g.next_seq++;
  intent.fields[CollectiveIntent::kKind] = kind;
  intent.fields[CollectiveIntent::kSeq] = seq;
  if (sent.issued >= 0) CommDebugMode::record(collective_name(kind), sent.issued);
  std::string description =
      std::string(collective_name(kind)) + "(" + what + ") #" + std::to_string(seq) + " on " + g.where();
  // A fake group has nobody to disagree with (and its exchange would bring nothing back).
  const bool check = g.check_collectives && g.size() > 1 && !g.fake;
  const bool on_issue = handoff.launches_on_issue();
  std::string trace_name = std::string(collective_name(kind)) + " #" + std::to_string(seq) + " " + g.name;
  auto issued = profiler::detail::recording() ? trace_issue(trace_name, description) : TraceIssue{};
  std::shared_ptr<DeviceCompletion> device = handoff.completion();
  auto launch = [&g, kind, check_here = check && !on_issue, on_issue, seq, description, intent, run = std::move(run),
                 trace_name, issued, sent = std::move(sent), after = std::move(after), handoff = std::move(handoff)] {
    // Within the handoff, so that waiting for `after` orders this collective's stream after it.
    handoff.run([&] {
      try {
        after.wait();
      } catch (const std::exception& e) {
        throw Error(description + " not run: " + message_without_backtrace(e));
      }
      TraceRun traced(g, trace_name, description, issued, sent.issued, /*on_comm_thread=*/!on_issue);
      reporting_hangs(g, seq, description, [&] {
        if (check_here) check_intent(g, intent);
        {
          CountAtEnd count(kind, sent.ended);
          run();
        }
        handoff.queued();
      });
    });
  };
  std::shared_ptr<WorkState> state;
  if (on_issue) {
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(g.check_failure_mutex);
      error = g.check_failure;
    }
    // The check runs on the comm thread (the group's Gloo backend is its), and the launch does not
    // wait for it: a host wait for the peers would stall a launch NCCL makes asynchronous (a
    // rank issuing its collectives as its buckets fill, say, before the others arrive).
    if (check && !error)
      g.comm_thread->enqueue(description, [&g, seq, description, intent] {
        try {
          reporting_hangs(g, seq, description, [&] { check_intent(g, intent); });
        } catch (const std::exception& e) {
          std::fprintf(stderr, "fsdpp: %s: %s\n", description.c_str(), message_without_backtrace(e).c_str());
          std::lock_guard<std::mutex> lock(g.check_failure_mutex);
          if (!g.check_failure) g.check_failure = std::current_exception();
          throw;
        }
      });
    if (!error) error = run_collective(description, launch);
    state = std::make_shared<WorkState>();
    state->description = description;
    state->finish(error);
  } else {
    state = g.comm_thread->enqueue(description, std::move(launch));
  }
  state->device = std::move(device);
  state->trace_name = std::move(trace_name);
  Work work(state);
  if (!async_op) work.wait();
  return work;
}

}  // namespace fsdpp::detail

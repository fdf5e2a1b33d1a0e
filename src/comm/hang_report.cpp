#include "comm/hang_report.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/error_message.h"
#include "comm/process_group_impl.h"

namespace fsdpp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// What each member posted: the sequence number it timed out in, or -1 for nothing.
struct Posts {
  bool store_answered = false;
  std::vector<int64_t> seq;
};

std::string key_of(const std::string& group, int member) {
  return "fsdpp/timeouts/" + group + "/" + std::to_string(member);
}

// Posted once a member has read the others' posts.
std::string done_key_of(const std::string& group, int member) {
  return "fsdpp/timeouts/" + group + "/done/" + std::to_string(member);
}

// Posts this member's seq and polls for the others' until all posted or `until`. check() and
// get() are polled, never store->wait(): a TCPStore wait that times out leaves its answer
// unread on the connection.
Posts collect(const c10::intrusive_ptr<c10d::Store>& store, const std::string& group, int me, int members,
              int64_t seq, Clock::time_point until) {
  Posts p;
  p.seq.assign(static_cast<size_t>(members), -1);
  const std::string mine = std::to_string(seq);
  store->set(key_of(group, me), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<bool> seen(static_cast<size_t>(members), false);
  for (;;) {
    bool all = true;
    for (int q = 0; q < members; ++q) {
      if (seen[q]) continue;
      if (store->check({key_of(group, q)})) {
        const std::vector<uint8_t> v = store->get(key_of(group, q));
        p.seq[q] = std::strtoll(std::string(v.begin(), v.end()).c_str(), nullptr, 10);
        seen[q] = true;
      } else {
        all = false;
      }
    }
    p.store_answered = true;
    if (all || Clock::now() >= until) {
      store->set(done_key_of(group, me), std::vector<uint8_t>{1});
      return p;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000 << " s";
  return out.str();
}

// "rank(s) [2] had not arrived (ranks [0, 1, 3] were waiting in it)", from the posts.
std::string who_was_missing(const ProcessGroupImpl& g, int64_t seq, const Posts& p) {
  // A member that timed out in an earlier collective was itself kept waiting there: the cause
  // is whoever posted nothing. Only when every member posted are those behind named as missing.
  std::vector<int> silent, behind, waiting;
  std::ostringstream elsewhere;
  for (int q = 0; q < g.size(); ++q) {
    const int global = g.ranks[q];
    if (p.seq[q] >= seq) {
      waiting.push_back(global);
    } else if (p.seq[q] >= 0) {
      behind.push_back(global);
      elsewhere << "; rank " << global << " timed out in #" << p.seq[q] << " of the group";
    } else {
      silent.push_back(global);
    }
  }
  const std::vector<int>& missing = silent.empty() ? behind : silent;
  std::ostringstream out;
  if (missing.empty())
    out << "every rank of the group had arrived (ranks " << list_ranks(waiting) << " were waiting in it)";
  else
    out << "rank(s) " << list_ranks(missing) << " had not arrived (ranks " << list_ranks(waiting) << " were waiting in it"
        << elsewhere.str() << ")";
  return out.str();
}

// Global rank 0 serves a TCP store from its own process: it stays, at most `grace` more, until
// the members that posted have read the posts too, or they would find no store to ask.
void linger(const ProcessGroupImpl& g, const std::vector<int64_t>& posted, std::chrono::milliseconds grace) {
  const Clock::time_point until = Clock::now() + grace;
  try {
    for (int q = 0; q < g.size(); ++q)
      while (posted[q] >= 0 && !g.store->check({done_key_of(g.name, q)}) && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } catch (const std::exception&) {
    // The report is made; a store that fails now changes nothing for this rank.
  }
}

}  // namespace

bool is_timeout(const std::exception& e) {
  std::string what = message_without_backtrace(e);
  std::transform(what.begin(), what.end(), what.begin(), [](unsigned char c) { return std::tolower(c); });
  return what.find("timed out") != std::string::npos || what.find("timeout") != std::string::npos;
}

bool peer_timed_out(const ProcessGroupImpl& g, int64_t seq) {
  // On its own thread, like the report: the store may not answer.
  auto promise = std::make_shared<std::promise<bool>>();
  std::future<bool> answer = promise->get_future();
  const Clock::time_point until = Clock::now() + std::chrono::seconds(1);
  std::thread([promise, store = g.store, group = g.name, me = g.rank, members = g.size(), seq, until] {
    try {
      for (;;) {
        for (int q = 0; q < members; ++q) {
          if (q == me || !store->check({key_of(group, q)})) continue;
          const std::vector<uint8_t> v = store->get(key_of(group, q));
          if (std::strtoll(std::string(v.begin(), v.end()).c_str(), nullptr, 10) == seq) return promise->set_value(true);
        }
        if (Clock::now() >= until) return promise->set_value(false);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    } catch (...) {
      promise->set_value(false);
    }
  }).detach();
  return answer.wait_until(until + std::chrono::milliseconds(500)) == std::future_status::ready && answer.get();
}

std::string report_hang(const ProcessGroupImpl& g, int64_t seq, const std::string& description, bool own_timeout) {
  const std::string timed_out = own_timeout ? "timed out after " + seconds(g.timeout)
                                            : "cut off when a peer's wait in it timed out (its connections closed)";
  const auto grace = std::min<std::chrono::milliseconds>(g.timeout, std::chrono::seconds(5));
  const Clock::time_point until = Clock::now() + grace;
  // On a thread of its own, abandoned if it outlives the grace period: a stopped rank 0 stops
  // the TCPStore server with it, and a store call would then block for the store's timeout.
  auto promise = std::make_shared<std::promise<Posts>>();
  std::future<Posts> posts = promise->get_future();
  std::thread([promise, store = g.store, group = g.name, me = g.rank, members = g.size(), seq, until] {
    try {
      promise->set_value(collect(store, group, me, members, seq, until));
    } catch (...) {
      promise->set_value(Posts{});
    }
  }).detach();
  std::string whom = "the ranks that had not arrived are unknown: the store did not answer within " + seconds(grace) +
                     " (a TCP store is served by global rank 0: is it stopped?)";
  bool answered = false;
  std::vector<int64_t> posted;
  if (posts.wait_until(until + std::chrono::seconds(1)) == std::future_status::ready) {
    const Posts p = posts.get();
    answered = p.store_answered;
    posted = p.seq;
    if (answered)
      whom = who_was_missing(g, seq, p);
    else
      whom = "the ranks that had not arrived are unknown: the store failed (a TCP store is served by global rank 0: "
             "has it exited?)";
  }
  std::fprintf(stderr, "fsdpp: collective timeout: %s: %s; %s\n", description.c_str(), timed_out.c_str(), whom.c_str());
  std::fflush(stderr);
  if (g.global_rank == 0 && answered) linger(g, posted, grace);
  return timed_out + "; " + whom;
}

}  // namespace fsdpp::detail

#pragma once
// A rank's Chrome trace as fsdpp::profiler::export_chrome_trace wrote it, read back for tests
// (test_profiler.cpp, and FSDP tests that check which unit's all-gather was issued when).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdpp::testing {

struct Trace {
  nlohmann::json events;
  std::map<int, std::string> track_names;

  explicit Trace(const std::string& path) {
    std::ifstream in(path);
    const nlohmann::json file = nlohmann::json::parse(in);
    events = file.at("traceEvents");
    for (const auto& e : events)
      if (e.at("name") == "thread_name") track_names[e.at("tid").get<int>()] = e.at("args").at("name");
  }

  // The events (not metadata) whose name starts with `prefix`.
  std::vector<nlohmann::json> named(const std::string& prefix) const {
    std::vector<nlohmann::json> found;
    for (const auto& e : events)
      if (e.at("ph") != "M" && e.at("name").get<std::string>().rfind(prefix, 0) == 0) found.push_back(e);
    return found;
  }

  const nlohmann::json& only(const std::string& prefix) const {
    static const nlohmann::json none;
    const auto found = named(prefix);
    EXPECT_EQ(found.size(), 1u) << "events named '" << prefix << "...'";
    for (const auto& e : events)
      if (e.at("ph") != "M" && e.at("name").get<std::string>().rfind(prefix, 0) == 0) return e;
    return none;
  }

  // The span each `collective` ("all_gather_into_tensor") was issued in (the innermost
  // record_function open on the issuing thread, e.g. "FSDP::unshard unit 3 (layer0)"), in the
  // order of their sequence numbers: the order they were issued when they share a group.
  std::vector<std::string> issued_in(const std::string& collective) const {
    std::vector<std::pair<long long, std::string>> issues;
    const std::string prefix = "issue " + collective + " #";
    for (const auto& e : named(prefix))
      issues.emplace_back(std::stoll(e.at("name").get<std::string>().substr(prefix.size())), e.at("args").at("in"));
    std::sort(issues.begin(), issues.end());
    std::vector<std::string> spans;
    for (auto& issue : issues) spans.push_back(std::move(issue.second));
    return spans;
  }
};

inline long long end_of(const nlohmann::json& e) { return e.at("ts").get<long long>() + e.at("dur").get<long long>(); }

}  // namespace fsdpp::testing

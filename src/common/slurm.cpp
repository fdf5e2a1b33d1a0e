#include "common/slurm.h"

#include <stdexcept>

namespace fsdpp::slurm {
namespace {

constexpr size_t kMaxHosts = 1 << 20;  // a typo such as node[1-999999999] must not eat memory

[[noreturn]] void fail(const std::string& where, const std::string& list, const std::string& why) {
  throw std::invalid_argument(where + "='" + list + "' is not a Slurm host list: " + why);
}

long long number(const std::string& text, const std::string& where, const std::string& list) {
  if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
    fail(where, list, "'" + text + "' is not a number");
  return std::stoll(text);
}

std::string padded(long long value, size_t width) {
  std::string text = std::to_string(value);
  return text.size() < width ? std::string(width - text.size(), '0') + text : text;
}

// The values of one bracket's contents, "01-04,07", as strings with their padding.
std::vector<std::string> bracket_values(const std::string& inside, const std::string& where, const std::string& list) {
  std::vector<std::string> values;
  size_t start = 0;
  for (;;) {
    const size_t comma = inside.find(',', start);
    const std::string item = inside.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      number(item, where, list);
      values.push_back(item);
    } else {
      const std::string low = item.substr(0, dash);
      const long long a = number(low, where, list), b = number(item.substr(dash + 1), where, list);
      if (b < a) fail(where, list, "range '" + item + "' runs backwards");
      if (static_cast<unsigned long long>(b - a) >= kMaxHosts) fail(where, list, "range '" + item + "' is too long");
      for (long long v = a; v <= b; ++v) values.push_back(padded(v, low.size()));
    }
    if (values.size() > kMaxHosts) fail(where, list, "more than " + std::to_string(kMaxHosts) + " hosts");
    if (comma == std::string::npos) return values;
    start = comma + 1;
  }
}

// One name with any number of brackets: the product of their values.
void expand_name(const std::string& name, const std::string& where, const std::string& list,
                 std::vector<std::string>& out) {
  std::vector<std::string> partial{""};
  size_t at = 0;
  while (at < name.size()) {
    const size_t open = name.find('[', at);
    const std::string literal = name.substr(at, open == std::string::npos ? std::string::npos : open - at);
    if (literal.find(']') != std::string::npos) fail(where, list, "']' without '['");
    for (auto& p : partial) p += literal;
    if (open == std::string::npos) break;
    const size_t close = name.find(']', open);
    if (close == std::string::npos) fail(where, list, "'[' without ']'");
    const auto values = bracket_values(name.substr(open + 1, close - open - 1), where, list);
    if (partial.size() * values.size() > kMaxHosts) fail(where, list, "more than " + std::to_string(kMaxHosts) + " hosts");
    std::vector<std::string> next;
    for (const auto& p : partial)
      for (const auto& v : values) next.push_back(p + v);
    partial.swap(next);
    at = close + 1;
  }
  out.insert(out.end(), partial.begin(), partial.end());
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, const std::string& where) {
  std::vector<std::string> hosts;
  size_t start = 0, depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') {
      if (depth == 0) fail(where, list, "']' without '['");
      --depth;
    }
    if (c != ',' || depth > 0) continue;
    const std::string name = list.substr(start, i - start);
    if (name.empty()) fail(where, list, "an empty host name");
    expand_name(name, where, list, hosts);
    if (hosts.size() > kMaxHosts) fail(where, list, "more than " + std::to_string(kMaxHosts) + " hosts");
    start = i + 1;
  }
  if (depth > 0) fail(where, list, "'[' without ']'");
  return hosts;
}

int whole_number(const std::string& name, const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument(name + "='" + text + "' is not a number");
  return std::stoi(text);
}

int default_port(const std::string& job_id) {
  long long id = 0;
  for (char c : job_id) {
    if (c < '0' || c > '9') break;  // an array job's "1234_5" keeps its job id
    id = (id * 10 + (c - '0')) % 10000;
  }
  return 15000 + static_cast<int>(id);
}

std::vector<int> tasks_per_node(const std::string& text) {
  std::vector<int> tasks;
  size_t start = 0;
  auto bad = [&] { throw std::invalid_argument("SLURM_TASKS_PER_NODE='" + text + "' is not of Slurm's form (\"4(x2),3\")"); };
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    long long repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      if (item.back() != ')') bad();
      const std::string times = item.substr(paren + 2, item.size() - paren - 3);
      if (times.empty() || times.size() > 7 || times.find_first_not_of("0123456789") != std::string::npos) bad();
      repeat = std::stoll(times);
      item = item.substr(0, paren);
    }
    if (item.empty() || item.size() > 7 || item.find_first_not_of("0123456789") != std::string::npos) bad();
    tasks.insert(tasks.end(), static_cast<size_t>(repeat), std::stoi(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return tasks;
}

}  // namespace fsdpp::slurm

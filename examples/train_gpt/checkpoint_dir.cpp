#include "checkpoint_dir.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <stdexcept>

namespace fs = std::filesystem;

namespace train_gpt {

std::string step_dir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return (fs::path(root) / name).string();
}

std::vector<SavedStep> complete_checkpoints(const std::string& root) {
  std::vector<SavedStep> found;
  for (const StepFolder& folder : step_folders_newest_first(root))
    if (folder.incomplete.empty()) found.push_back(folder.saved);
  std::reverse(found.begin(), found.end());
  return found;
}

std::optional<SavedStep> newest_complete_checkpoint(const std::string& root) {
  auto all = complete_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::vector<StepFolder> step_folders_newest_first(const std::string& root) {
  std::vector<StepFolder> found;
  std::error_code ec;
  static const std::regex name("step-([0-9]{8})(\\.tmp-.*)?");
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string base = entry.path().filename().string();
    if (!std::regex_match(base, m, name)) continue;
    StepFolder folder{{std::stoll(m[1].str()), entry.path().string()}, ""};
    if (m[2].matched) folder.incomplete = "a save that never finished (its staging folder)";
    else if (!fs::is_regular_file(entry.path() / "metadata.json", ec)) folder.incomplete = "incomplete: no metadata.json";
    found.push_back(std::move(folder));
  }
  std::sort(found.begin(), found.end(), [](const StepFolder& a, const StepFolder& b) {
    if (a.saved.step != b.saved.step) return a.saved.step > b.saved.step;
    if (a.incomplete.empty() != b.incomplete.empty()) return a.incomplete.empty();
    return a.saved.dir < b.saved.dir;
  });
  return found;
}

SavedStep checkpoint_at(const std::string& dir) {
  const fs::path path = fs::path(dir).lexically_normal();
  const fs::path folder = path.filename().empty() ? path.parent_path() : path;
  for (const SavedStep& s : complete_checkpoints(folder.parent_path().string()))
    if (fs::path(s.dir).filename() == folder.filename()) return s;
  throw std::invalid_argument("--resume-from " + dir + " is not a complete checkpoint (a step-NNNNNNNN folder with " +
                              "a metadata.json)");
}

std::string cannot_resume(const SavedStep& failed, const std::string& error) {
  const std::string root = fs::path(failed.dir).parent_path().string();
  std::optional<SavedStep> older;
  for (const SavedStep& s : complete_checkpoints(root))
    if (s.step < failed.step) older = s;
  std::string text = "cannot resume from " + failed.dir + ": " + error + "\n";
  if (older)
    return text + "the newest older complete checkpoint is " + older->dir + " (step " + std::to_string(older->step) +
           "): continue from it with --resume-from " + older->dir;
  return text + "there is no older complete checkpoint in " + root + ": start the run again without --resume";
}

std::vector<std::string> prune_checkpoints(const std::string& root, int64_t keep) {
  std::vector<std::string> removed;
  auto complete = complete_checkpoints(root);
  for (size_t i = 0; i + static_cast<size_t>(keep) < complete.size(); ++i) removed.push_back(complete[i].dir);
  std::error_code ec;
  static const std::regex staging("step-[0-9]{8}\\.tmp-.*");
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (std::regex_match(entry.path().filename().string(), staging)) removed.push_back(entry.path().string());
  for (const auto& dir : removed) fs::remove_all(dir, ec);
  return removed;
}

}  // namespace train_gpt

#pragma once
// The trainer's checkpoint folder: one distributed checkpoint per saved step, named
// step-NNNNNNNN. fsdpp::checkpoint::save writes into a staging folder and renames it into place
// only once every rank's file and the metadata are written, so a folder with the final name
// and a metadata.json is complete; a save killed midway leaves only step-N.tmp-* behind.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace train_gpt {

struct SavedStep {
  int64_t step;
  std::string dir;
};

std::string step_dir(const std::string& root, int64_t step);
// Complete checkpoints under `root`, oldest first.
std::vector<SavedStep> complete_checkpoints(const std::string& root);
std::optional<SavedStep> newest_complete_checkpoint(const std::string& root);
// Every step folder under `root`, newest first (at one step, the complete folder before staging
// ones), and for each one that cannot be resumed from, why ("" when it is complete): what
// --resume tries in turn.
struct StepFolder {
  SavedStep saved;
  std::string incomplete;
};
std::vector<StepFolder> step_folders_newest_first(const std::string& root);
// The complete checkpoint at `dir` (a step-NNNNNNNN folder); throws naming it otherwise.
SavedStep checkpoint_at(const std::string& dir);
// What to say when resuming from `failed` threw `error`: the newest older complete checkpoint
// and the flag that resumes from it, or that there is none.
std::string cannot_resume(const SavedStep& failed, const std::string& error);
// Removes all but the newest `keep` complete checkpoints and the staging folders of saves that
// never finished. Only while no save of this run is pending. Returns what it removed.
std::vector<std::string> prune_checkpoints(const std::string& root, int64_t keep);

}  // namespace train_gpt

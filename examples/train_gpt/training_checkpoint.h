#pragma once
// The trainer's checkpoints: what one holds, saving them as the run goes (in the background, or
// at once when preempted), and choosing and loading the one a run continues from.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <fsdpp/checkpoint.h>

#include "checkpoint_dir.h"
#include "config.h"
#include "model.h"
#include "text_corpus.h"

namespace train_gpt {

// What a checkpoint holds: the model, the optimizer, the data loader (Stateful), the run's flags
// and the step.
fsdpp::checkpoint::State training_state(Model& model, torch::optim::Optimizer& opt, const BatchSampler& sampler,
                                        const Config& c, int64_t step);

// Where a run continues from, and loading it; every member is collective over the default group.
// --resume-from DIR: that checkpoint, strictly (an error names the newest older complete one and
// the flag that continues from it). --resume (also a restarted attempt with --ckpt-dir): the step
// folders of --ckpt-dir newest first, each one that is incomplete or that some rank cannot read
// skipped with one line naming it and why, all ranks moving on together. A restarted attempt
// given --resume-from continues from --ckpt-dir's newest once that holds a complete checkpoint.
class Resumption {
 public:
  using Say = std::function<void(const std::string&)>;  // rank 0's progress line
  Resumption(const Config& c, bool restarted, Say say);

  // How many candidates were skipped so far.
  int skipped() const { return skipped_; }
  // Reads the newest candidate's run record (skipping those no rank can read) and adopts its flags
  // into `c`; false when no candidate is left (then `c` is as given).
  bool adopt_run_record(Config& c);
  // Loads model, optimizer and data position from the adopted candidate or, failing that on any
  // rank, the next older one with the same run record; the step loaded, or none when no candidate
  // loads (the model and optimizer may then hold parts of a failed load).
  std::optional<SavedStep> load(Model& model, torch::optim::Optimizer& opt, BatchSampler& sampler);

 private:
  // Skips candidate `i` with one line, or (--resume-from) throws naming the way on.
  void skip(size_t i, const std::string& why);
  // The run record of candidate `i`, or the first failing rank's error (agreed by every rank).
  std::pair<std::string, std::string> read_run_record(size_t i);

  std::vector<StepFolder> candidates_;  // newest first
  size_t adopted_ = 0;
  std::string adopted_record_;
  bool strict_ = false;
  int skipped_ = 0;
  Say say_;
};

// The run's saves into --ckpt-dir (none without it): one in the background at a time, pruned to
// --keep once complete.
class Checkpoints {
 public:
  // Creates --ckpt-dir and removes what killed saves left there (rank 0).
  Checkpoints(const Config& c, int rank);
  bool enabled() const { return !dir_.empty(); }
  // Collective: stages `state` (of `step`) and writes it in the background, after the pending save.
  void save_in_background(const fsdpp::checkpoint::State& state, int64_t step);
  // Waits for the pending save (throws its error), then prunes.
  void finish();
  // Collective: the checkpoint of `step` written now, unless it is already saved (or being saved:
  // then waited for); returns its folder.
  std::string save_now(int64_t step, const std::function<fsdpp::checkpoint::State()>& state);

 private:
  std::string dir_;
  int64_t keep_;
  int rank_;
  int64_t saved_step_ = -1;  // the newest step this run saved or is saving
  fsdpp::checkpoint::SaveHandle pending_;
  bool save_pending_ = false;
};

// Fault injection for the tests: FSDPP_TRAIN_GPT_KILL_IN_SAVE=STEP makes rank 0 SIGKILL itself
// while the checkpoint of STEP is being written in the background.
bool kill_in_save(int64_t step, int rank);

}  // namespace train_gpt

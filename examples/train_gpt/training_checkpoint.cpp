#include "training_checkpoint.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <fsdpp/fsdpp.h>

namespace ckpt = fsdpp::checkpoint;

namespace train_gpt {
namespace {

// Collective: the error of the lowest rank that has one ("" on ranks without), on every rank, as
// one line ("rank R: ..." when there are several ranks); "" when no rank failed. So all ranks
// take the same way after something only some of them could read.
std::string first_error(std::string error) {
  const fsdpp::ProcessGroup world = fsdpp::default_group();
  at::Tensor first = torch::tensor({static_cast<int64_t>(error.empty() ? world.size() : world.rank())}, torch::kLong);
  fsdpp::all_reduce(first, fsdpp::ReduceOp::MIN);
  const int failed = static_cast<int>(first.item<int64_t>());
  if (failed == world.size()) return "";
  fsdpp::broadcast_bytes(error, failed);
  for (size_t at = error.find('\n'); at != std::string::npos; at = error.find('\n', at)) error.replace(at, 1, "; ");
  if (error.size() > 600) error = error.substr(0, 600) + " [...]";  // a list of every entry, say
  return world.size() > 1 ? "rank " + std::to_string(failed) + ": " + error : error;
}

// This rank's part of a checkpoint, read into the model's and a fresh optimizer's tensors.
struct ReadState {
  fsdpp::StateDict model_sd;
  fsdpp::OptimizerStateDict osd;
  ckpt::State state;
};

// Not collective: reads `dir` into `out`; the error, or "" when it read.
std::string read_training_state(Model& model, BatchSampler& sampler, const std::string& dir, ReadState& out) {
  try {
    out.osd = ckpt::optim_state_dict_to_load(ckpt::read_metadata(dir), out.model_sd, "optim.");
    out.state = ckpt::to_state(out.model_sd, "model.");
    out.state.merge(ckpt::to_state(out.osd, "optim."));
    out.state.merge(ckpt::to_state(sampler, "data_loader."));
    // In place: one read buffer at a time, not a second copy of this rank's state (a model that
    // barely fits its ranks must still resume). A load that fails may leave parts of the model
    // changed: the next candidate's load, or a model built afresh, replaces them all.
    ckpt::load(out.state, dir, ckpt::LoadOptions().in_place(true));
    return "";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    return what.empty() ? "unknown error" : what;
  }
}

}  // namespace

ckpt::State training_state(Model& model, torch::optim::Optimizer& opt, const BatchSampler& sampler, const Config& c,
                           int64_t step) {
  ckpt::State state = ckpt::to_state(fsdpp::get_model_state_dict(model), "model.");
  state.merge(ckpt::to_state(fsdpp::get_optimizer_state_dict(model, opt), "optim."));
  state.merge(ckpt::to_state(sampler, "data_loader."));
  state["run"] = c.run_record();
  state["step"] = step;
  return state;
}

Resumption::Resumption(const Config& c, bool restarted, Say say) : say_(std::move(say)) {
  if (!c.resume && c.resume_from.empty()) return;
  // Rank 0 looks (every rank gets its answer): "S" (strict) or "R", then a line per candidate.
  std::string listed;
  if (fsdpp::default_group().rank() == 0) {
    try {
      const bool strict = !c.resume_from.empty() && !(restarted && !c.ckpt_dir.empty() &&
                                                      newest_complete_checkpoint(c.ckpt_dir).has_value());
      const std::vector<StepFolder> found =
          strict ? std::vector<StepFolder>{{checkpoint_at(c.resume_from), ""}} : step_folders_newest_first(c.ckpt_dir);
      listed = strict ? "S" : "R";
      for (const StepFolder& f : found)
        listed += "\n" + std::to_string(f.saved.step) + "\t" + f.saved.dir + "\t" + f.incomplete;
    } catch (const std::invalid_argument& e) {
      listed = std::string("!") + e.what();
    }
  }
  fsdpp::broadcast_bytes(listed, 0);
  if (listed[0] == '!') throw std::invalid_argument(listed.substr(1));
  strict_ = listed[0] == 'S';
  std::istringstream in(listed.substr(1));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const auto tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    candidates_.push_back({{std::stoll(line.substr(0, tab1)), line.substr(tab1 + 1, tab2 - tab1 - 1)},
                           line.substr(tab2 + 1)});
  }
}

void Resumption::skip(size_t i, const std::string& why) {
  if (strict_) throw std::runtime_error(cannot_resume(candidates_[i].saved, why));
  ++skipped_;
  say_("skipping " + candidates_[i].saved.dir + ": " + why);
}

std::pair<std::string, std::string> Resumption::read_run_record(size_t i) {
  std::string error;
  ckpt::State record{{"run", std::string()}};
  try {
    ckpt::load(record, candidates_[i].saved.dir);
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  return {record["run"].to_string(), first_error(error)};
}

bool Resumption::adopt_run_record(Config& c) {
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (!candidates_[i].incomplete.empty()) {
      skip(i, candidates_[i].incomplete);
      continue;
    }
    auto [record, error] = read_run_record(i);
    if (!error.empty()) {
      skip(i, error);
      continue;
    }
    // A flag given with another value than the record's: the user's to fix, not a reason to skip.
    c.adopt_run_record(record, candidates_[i].saved.dir);
    adopted_ = i;
    adopted_record_ = record;
    return true;
  }
  candidates_.clear();
  return false;
}

std::optional<SavedStep> Resumption::load(Model& model, torch::optim::Optimizer& opt, BatchSampler& sampler) {
  for (size_t i = adopted_; i < candidates_.size(); ++i) {
    const SavedStep& saved = candidates_[i].saved;
    if (i != adopted_) {  // an older one: the same run's?
      if (!candidates_[i].incomplete.empty()) {
        skip(i, candidates_[i].incomplete);
        continue;
      }
      auto [record, error] = read_run_record(i);
      if (error.empty() && record != adopted_record_)
        error = "its run's flags differ from those of " + candidates_[adopted_].saved.dir;
      if (!error.empty()) {
        skip(i, error);
        continue;
      }
    }
    ReadState read{fsdpp::get_model_state_dict(model), {}, {}};
    if (const std::string error = first_error(read_training_state(model, sampler, saved.dir, read)); !error.empty()) {
      skip(i, error);
      continue;
    }
    try {  // every rank read its part: now collectively into the model and optimizer
      fsdpp::set_model_state_dict(model, read.model_sd);
      fsdpp::set_optimizer_state_dict(model, opt, read.osd);
      ckpt::load_stateful(sampler, read.state, "data_loader.");
    } catch (const std::exception& e) {
      throw std::runtime_error(cannot_resume(saved, e.what()));
    }
    return saved;
  }
  return std::nullopt;
}

Checkpoints::Checkpoints(const Config& c, int rank) : dir_(c.ckpt_dir), keep_(c.keep), rank_(rank) {
  if (!enabled() || rank != 0) return;
  std::filesystem::create_directories(dir_);
  prune_checkpoints(dir_, keep_);  // and what killed saves left behind
}

void Checkpoints::save_in_background(const ckpt::State& state, int64_t step) {
  finish();
  pending_ = ckpt::async_save(state, step_dir(dir_, step));
  save_pending_ = true;
  saved_step_ = step;
}

void Checkpoints::finish() {
  if (!save_pending_) return;
  save_pending_ = false;
  pending_.wait();
  if (rank_ == 0) prune_checkpoints(dir_, keep_);
}

std::string Checkpoints::save_now(int64_t step, const std::function<ckpt::State()>& state) {
  finish();
  const std::string dir = step_dir(dir_, step);
  if (saved_step_ == step) return dir;
  ckpt::save(state(), dir);
  saved_step_ = step;
  if (rank_ == 0) prune_checkpoints(dir_, keep_);
  return dir;
}

bool kill_in_save(int64_t step, int rank) {
  const char* at = std::getenv("FSDPP_TRAIN_GPT_KILL_IN_SAVE");
  return at != nullptr && rank == 0 && std::atoll(at) == step;
}

}  // namespace train_gpt

#pragma once
// TensorBoard event files from C++, as PyTorch's torch.utils.tensorboard.SummaryWriter writes
// them: `tensorboard --logdir <log_dir>` shows the scalars and texts. Not thread-safe: write
// from one thread (typically rank 0's training loop).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <torch/arg.h>

namespace fsdpp {

struct SummaryWriterOptions {
  // A resumed run: TensorBoard discards the events of earlier files in log_dir whose step is
  // >= purge_step (those steps are about to be written again).
  TORCH_ARG(std::optional<int64_t>, purge_step);
  TORCH_ARG(std::string, filename_suffix);  // appended to the event file's name
  TORCH_ARG(double, flush_secs) = 120;      // buffered events reach the file at most this late (on the next add)
  TORCH_ARG(int, max_queue) = 10;           // ... or once this many are buffered
};

class SummaryWriter {
 public:
  // Creates log_dir (with its parents) and the event file
  // log_dir/events.out.tfevents.<seconds>.<hostname>.<pid>.<counter><suffix>.
  // Throws fsdpp::Error (a std::runtime_error) naming the path if either cannot be created.
  explicit SummaryWriter(std::string log_dir, SummaryWriterOptions options = {});
  ~SummaryWriter();  // flushes; a failure there is reported on stderr, not thrown
  SummaryWriter(SummaryWriter&&) noexcept;
  SummaryWriter& operator=(SummaryWriter&&) noexcept;

  // wall_time in seconds since the epoch; now if not given. The value is stored as a float32.
  void add_scalar(const std::string& tag, double value, int64_t step,
                  std::optional<double> wall_time = {});
  // TensorBoard's text plugin (Markdown); shown under "<tag>/text_summary", as PyTorch names it.
  void add_text(const std::string& tag, const std::string& text, int64_t step,
                std::optional<double> wall_time = {});

  void flush();  // throws naming the file if the write fails
  void close();  // flush and close; adds after it throw

  const std::string& log_dir() const;
  const std::string& file_path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdpp

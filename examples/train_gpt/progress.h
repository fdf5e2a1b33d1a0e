#pragma once
// Rank 0's output: progress lines, and between them a progress bar redrawn in place when
// stdout is a terminal (never in logs or pipes).
#include <cstdint>
#include <string>

namespace train_gpt {

class Progress {
 public:
  Progress(bool active, bool bar_allowed, int64_t total_steps);
  // A line of the log (clears the bar first).
  void line(const std::string& text);
  // After each step: redraws the bar.
  void step(int64_t step, double loss);
  void finish();

 private:
  bool active_, bar_;
  int64_t total_;
  bool drawn_ = false;
};

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace train_gpt

#include "progress.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace train_gpt {

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  char buffer[1024];
  std::vsnprintf(buffer, sizeof buffer, fmt, args);
  va_end(args);
  return buffer;
}

namespace {

// Under fsdpp-run our stdout is its pipe; it says whether its own stdout is a terminal.
bool stdout_reaches_a_terminal() {
  const char* launcher_says = std::getenv("FSDPP_STDOUT_IS_TERMINAL");
  return ::isatty(STDOUT_FILENO) || (launcher_says && std::string(launcher_says) == "1");
}

}  // namespace

Progress::Progress(bool active, bool bar_allowed, int64_t total_steps)
    : active_(active), bar_(active && bar_allowed && stdout_reaches_a_terminal()), total_(total_steps) {}

void Progress::line(const std::string& text) {
  if (!active_) return;
  if (drawn_) std::fputs("\r\033[K", stdout);
  drawn_ = false;
  std::fputs(text.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void Progress::step(int64_t step, double loss) {
  if (!bar_) return;
  const int width = 30;
  const int filled = static_cast<int>(width * step / std::max<int64_t>(1, total_));
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(width, '.');
  std::printf("\r\033[K[%s] step %lld/%lld loss %.4f", bar.c_str(), static_cast<long long>(step),
              static_cast<long long>(total_), loss);
  std::fflush(stdout);
  drawn_ = true;
}

void Progress::finish() {
  if (drawn_) std::fputs("\r\033[K", stdout);
  drawn_ = false;
  std::fflush(stdout);
}

}  // namespace train_gpt

#include "output_relay.h"

#include <unistd.h>

#include <cerrno>
#include <string>

#include "launcher.h"
#include "run_summary.h"

namespace fsdpp_run {
namespace {

// ---------------------------------------------------------------- output

// Writes all of `data`; gives up silently if the reader is gone, because
// losing our output must not stop us from supervising the ranks.
void write_all(int fd, const std::string& data) {
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}


// ---------------------------------------------------------------- relaying

// When our stdout is a terminal: the one status line drawn below the log (the last redraw of
// some rank's carriage-return line, prefixed), erased while lines are written above it.
class StatusLine {
 public:
  void enable() { enabled_ = true; }
  void end() {  // the job is over: nothing more to redraw
    erase();
    text_.clear();
  }
  bool enabled() const { return enabled_; }
  // Erases the line from the screen; `text_` stays, to be drawn again after the log lines.
  void erase() {
    if (drawn_) write_all(STDOUT_FILENO, "\r\033[K");
    drawn_ = false;
  }
  void draw() {
    if (!enabled_ || text_.empty() || drawn_) return;
    write_all(STDOUT_FILENO, "\r\033[K" + text_);
    drawn_ = true;
  }
  // `owner` now shows `text` ("" once its line is complete or erased by the rank).
  void set(const void* owner, const std::string& text) {
    if (text.empty() && owner != owner_) return;  // another rank's status stays
    erase();
    owner_ = owner;
    text_ = text;
    draw();
  }

 private:
  bool enabled_ = false;
  const void* owner_ = nullptr;
  std::string text_;
  bool drawn_ = false;
};

// One, as our stdout has one cursor; say() erases it too.
StatusLine status_line;

// What a terminal would show of `line` (no newline): the text after its last carriage return,
// without the erase-line sequence ("\033[K", "\033[2K") a redraw begins with.
std::string shown_text(const std::string& line) {
  const size_t cr = line.rfind('\r');
  std::string text = cr == std::string::npos ? line : line.substr(cr + 1);
  while (text.size() >= 3 && text.compare(0, 2, "\033[") == 0) {
    const size_t k = text.find_first_not_of("0123456789", 2);
    if (k == std::string::npos || text[k] != 'K') break;
    text.erase(0, k + 1);
  }
  return text;
}


void write_lines(Stream& s, const std::string& lines) {
  if (lines.empty()) return;
  status_line.erase();
  write_all(s.out_fd, lines);
  status_line.draw();
}

void emit_complete_lines(Stream& s) {
  std::string out;
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = s.pending.substr(start, nl + 1 - start);
    if (line.find(fsdpp_run::kTimeoutMarker) != std::string::npos) s.timeout_report = line.substr(0, line.size() - 1);
    if (s.redraws) line = shown_text(line.substr(0, line.size() - 1)) + "\n";
    out += s.prefix + line;
  }
  s.pending.erase(0, start);
  if (s.redraws && start > 0) status_line.set(&s, "");  // a completed line ends the redraws
  write_lines(s, out);
  if (!s.redraws) return;
  // Only the last redraw matters: keep pending from its carriage return on.
  const size_t cr = s.pending.rfind('\r');
  if (cr == std::string::npos) return;
  s.pending.erase(0, cr);
  const std::string text = shown_text(s.pending);
  status_line.set(&s, text.empty() ? "" : s.prefix + text);
}

}  // namespace

// A line without its newline still deserves its prefix, once no more of it
// is coming.
void flush_partial_line(Stream& s) {
  if (s.pending.empty()) return;
  std::string text = s.redraws ? shown_text(s.pending) : s.pending;
  if (s.redraws) status_line.set(&s, "");
  if (!text.empty()) write_lines(s, s.prefix + text + "\n");
  s.pending.clear();
}

void close_stream(Stream& s) {
  if (s.fd < 0) return;
  close(s.fd);
  s.fd = -1;
  flush_partial_line(s);
}

// Reads one chunk; returns false when nothing more is available right now.
bool read_once(Stream& s) {
  if (s.fd < 0) return false;
  char buf[65536];
  ssize_t n;
  do n = read(s.fd, buf, sizeof buf); while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return false;
  if (n <= 0) {  // end of file: every writer is gone
    close_stream(s);
    return false;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  emit_complete_lines(s);
  return true;
}

// Reads what a rank left in the pipe. Bounded (16 x 64 KiB covers a full
// pipe buffer) so a chatty grandchild cannot stall the launcher.
void drain(Stream& s) {
  for (int i = 0; i < 16 && read_once(s); ++i) {
  }
}

void enable_status_line() { status_line.enable(); }
bool status_line_enabled() { return status_line.enabled(); }
void end_status_line() { status_line.end(); }

void say(const std::string& message) {
  status_line.erase();
  write_all(STDERR_FILENO, "fsdpp-run: " + message + "\n");
  status_line.draw();
}

}  // namespace fsdpp_run

#include "comm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/process_group_impl.h"

namespace fsdpp::detail {

// One per rank, on its own cache lines: what it posted and read, and the word peers sleep on.
struct ShmTransport::Control {
  alignas(128) std::atomic<uint64_t> posted;  // the last round whose buffer is filled
  std::atomic<uint64_t> consumed;             // the last round whose peers' buffers were read
  std::atomic<uint32_t> bell;                 // bumped on every change above (a futex word)
  std::atomic<uint32_t> sleepers;             // peers asleep on `bell`
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> broken;
};

namespace {

constexpr int64_t kBufferBytes = int64_t{1} << 21;
constexpr int64_t kAlign = 4096;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

int64_t segment_bytes_for(int size) {
  return round_up(static_cast<int64_t>(sizeof(ShmTransport::Control)) * size, kAlign) + 2 * size * kBufferBytes;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, long nanoseconds) {
  timespec t{0, nanoseconds};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &t, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A zombie (exited, not yet reaped by its launcher) counts as gone.
bool alive(int pid) {
  if (pid <= 0) return true;  // not attached yet
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return close == std::string::npos || close + 2 >= text.size() || (text[close + 2] != 'Z' && text[close + 2] != 'X');
}

std::string read_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string link_of(const char* path) {
  char target[256] = {};
  const ssize_t n = readlink(path, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}

// Equal on two processes that can share a segment: same boot of the same machine, same network
// namespace (two "nodes" on one machine, as the multi-node test makes, stay apart), same pid
// namespace (peers' pids tell whether they still run), same user.
// The setting is part of it, so that ranks disagreeing on it all fall back to Gloo.
std::string host_identity() {
  const char* setting = std::getenv("FSDPP_SHARED_MEMORY");
  return read_line("/proc/sys/kernel/random/boot_id") + "|" + link_of("/proc/self/ns/net") + "|" +
         link_of("/proc/self/ns/pid") + "|" +
         std::to_string(geteuid()) + "|" + (setting ? setting : "");
}

bool enabled() {
  const char* setting = std::getenv("FSDPP_SHARED_MEMORY");
  return !setting || std::string(setting) != "0";
}

// Polled, never store.wait(): a TCPStore wait that times out leaves its answer unread on the
// connection, which the hang report then uses.
std::string get_string(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int ms = 1; !store.check({key}); ms = std::min(ms * 2, 50)) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("setting up the shared-memory transport timed out waiting for " + key);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
  const std::vector<uint8_t> v = store.get(key);
  return std::string(v.begin(), v.end());
}

void set_string(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

void* map_segment(int fd, int64_t bytes) {
  void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Collective over g: agree on sharing, then rank 0 makes the segment, every member maps it,
// and rank 0 unlinks its name once all have (a crash later leaves nothing in /dev/shm).
std::shared_ptr<ShmTransport> make_transport(const ProcessGroupImpl& g) {
  const int n = g.size();
  auto store = c10::make_intrusive<c10d::PrefixStore>("fsdpp/" + g.name + "/shm/", g.store);
  set_string(*store, "who/" + std::to_string(g.rank), host_identity());
  bool same_host = true;
  for (int q = 0; q < n; ++q)
    if (get_string(*store, "who/" + std::to_string(q), g.timeout) != host_identity()) same_host = false;
  if (!same_host || !enabled()) return nullptr;

  const int64_t bytes = segment_bytes_for(n);
  std::string name;
  void* segment = nullptr;
  // Rank 0 unlinks the name when it leaves, whether all mapped it or the handshake failed.
  struct Unlink {
    std::string name;
    ~Unlink() { if (!name.empty()) shm_unlink(name.c_str()); }
  } unlink_on_exit;
  if (g.rank == 0) {
    static std::atomic<int> made{0};
    name = "/fsdpp-" + std::to_string(getpid()) + "-" + std::to_string(made++);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    int error = fd >= 0 ? 0 : errno;
    if (fd >= 0) {
      unlink_on_exit.name = name;
      // Reserved now: a full /dev/shm must fail here, not as SIGBUS on first touch.
      error = posix_fallocate(fd, 0, bytes);
      if (error == 0 && !(segment = map_segment(fd, bytes))) error = errno;
      close(fd);
    }
    // Said once: Gloo still carries the bytes, only slower (a container's 64 MiB /dev/shm fits
    // a few groups).
    static std::atomic<bool> warned{false};
    if (!segment && error != 0 && !warned.exchange(true))
      std::fprintf(stderr, "fsdpp: group %s: cannot reserve its shared-memory segment (%lld bytes in /dev/shm: %s); "
                   "its collectives go over Gloo\n", g.name.c_str(), static_cast<long long>(bytes), std::strerror(error));
    set_string(*store, "name", segment ? name : "");
  } else {
    name = get_string(*store, "name", g.timeout);
    if (!name.empty()) {
      const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
      int error = fd >= 0 ? 0 : errno;
      if (fd >= 0) {
        segment = map_segment(fd, bytes);
        if (!segment) error = errno;
        close(fd);
      }
      // Rank 0 made the segment, so this rank's failure alone sends the group to Gloo: say so,
      // once (a mesh makes many groups).
      static std::atomic<bool> warned{false};
      if (!segment && !warned.exchange(true))
        std::fprintf(stderr, "fsdpp: group %s: rank %d cannot map its shared-memory segment %s (%lld bytes: %s); "
                     "its collectives go over Gloo\n", g.name.c_str(), g.rank, name.c_str(),
                     static_cast<long long>(bytes), std::strerror(error));
    }
  }
  set_string(*store, "mapped/" + std::to_string(g.rank), segment ? "1" : "0");
  if (g.rank == 0) {
    bool all = segment != nullptr;
    for (int q = 1; q < n; ++q) all = get_string(*store, "mapped/" + std::to_string(q), g.timeout) == "1" && all;
    set_string(*store, "ready", all ? "1" : "0");
  }
  const bool ready = get_string(*store, "ready", g.timeout) == "1";
  if (!ready) {
    if (segment) munmap(segment, static_cast<size_t>(bytes));
    return nullptr;
  }
  // Only keys left by an earlier handshake under this group's name could say so.
  if (!segment) throw std::runtime_error("the shared-memory handshake of group " + g.name + " read stale store keys");
  return std::make_shared<ShmTransport>(segment, bytes, g.rank, n, g.ranks, g.timeout);
}

}  // namespace

ShmTransport::ShmTransport(void* segment, int64_t segment_bytes, int rank, int size, std::vector<int> global_ranks,
                           std::chrono::milliseconds timeout)
    : base_(static_cast<uint8_t*>(segment)),
      segment_bytes_(segment_bytes),
      rank_(rank),
      size_(size),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      control_(reinterpret_cast<Control*>(segment)),
      data_(base_ + round_up(static_cast<int64_t>(sizeof(Control)) * size, kAlign)),
      buffer_bytes_(kBufferBytes) {
  // The segment starts zeroed, which is every counter's initial value.
  control_[rank_].pid.store(getpid());
}

ShmTransport::~ShmTransport() { munmap(base_, static_cast<size_t>(segment_bytes_)); }

uint8_t* ShmTransport::buffer(int q, uint64_t round) const {
  return data_ + (2 * q + static_cast<int64_t>(round % 2)) * buffer_bytes_;
}

void ShmTransport::ring(int q) {
  control_[q].bell.fetch_add(1);
  if (control_[q].sleepers.load()) futex_wake_all(&control_[q].bell);
}

void ShmTransport::mark_broken() {
  control_[rank_].broken.store(1);
  ring(rank_);
}

// A failed exchange leaves the members at different rounds, so no later one may run: it could
// read a buffer of the wrong round.
void ShmTransport::require_unbroken() const {
  if (control_[rank_].broken.load())
    throw std::runtime_error("shared-memory exchange closed: an earlier collective of this group failed here");
  for (int p = 0; p < size_; ++p)
    if (control_[p].broken.load())
      throw std::runtime_error("shared-memory exchange closed by peer: rank " + std::to_string(global_ranks_[p]) +
                               " failed in a collective of this group");
}

// Spins briefly (a peer is often a few microseconds away), then sleeps on q's bell; every
// 20 ms asleep it checks that q still runs and no member failed.
void ShmTransport::wait_for(int q, const std::function<bool()>& ready, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int spins = 0;; ++spins) {
    const uint32_t bell = control_[q].bell.load();
    if (ready()) return;
    if (spins < 256) {
      cpu_relax();
      continue;
    }
    control_[q].sleepers.fetch_add(1);
    futex_wait(&control_[q].bell, bell, 20'000'000);
    control_[q].sleepers.fetch_sub(1);
    // Only q's exit matters (others may have finished their part and left), and only if it
    // exited before doing what we wait for (its bytes stay mapped after it exits); a member that
    // failed ends the collective for everyone.
    if (!alive(control_[q].pid.load()) && !ready())
      throw std::runtime_error("rank " + std::to_string(global_ranks_[q]) + " (pid " +
                               std::to_string(control_[q].pid.load()) + ") exited during a shared-memory exchange");
    require_unbroken();
    if (std::chrono::steady_clock::now() >= deadline)
      throw std::runtime_error("shared-memory exchange timed out after " + std::to_string(timeout_.count()) +
                               " ms waiting for rank " + std::to_string(global_ranks_[q]) + " to " + what);
  }
}

void ShmTransport::round(const std::function<void(uint8_t*)>& write,
                         const std::function<void(const std::vector<const uint8_t*>&)>& read) {
  require_unbroken();
  const uint64_t t = ++rounds_;
  // This buffer last carried round t - 2: every peer must have read it.
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_for(q, [&] { return control_[q].consumed.load() + 2 >= t; }, "read an earlier round");
  write(buffer(rank_, t));
  control_[rank_].posted.store(t);
  ring(rank_);
  std::vector<const uint8_t*> buffers(static_cast<size_t>(size_));
  for (int q = 0; q < size_; ++q) {
    if (q != rank_) wait_for(q, [&] { return control_[q].posted.load() >= t; }, "post its part");
    buffers[q] = buffer(q, t);
  }
  read(buffers);
  control_[rank_].consumed.store(t);
  ring(rank_);
}

void ShmTransport::all_gather(const at::Tensor& output, const at::Tensor& input, const Place& place) {
  auto* out = static_cast<uint8_t*>(output.data_ptr());
  const auto* in = static_cast<const uint8_t*>(input.data_ptr());
  const int64_t bytes = input.numel() * input.element_size();
  auto put = [&](int q, int64_t offset, const uint8_t* from, int64_t len) {
    if (place)
      place(q, offset, from, len);
    else if (out + q * bytes + offset != from)  // in place
      std::memcpy(out + q * bytes + offset, from, static_cast<size_t>(len));
  };
  put(rank_, 0, in, bytes);
  try {
    for (int64_t offset = 0; offset < bytes; offset += buffer_bytes_) {
      const int64_t len = std::min(buffer_bytes_, bytes - offset);
      round([&](uint8_t* mine) { std::memcpy(mine, in + offset, static_cast<size_t>(len)); },
            [&](const std::vector<const uint8_t*>& buffers) {
              for (int q = 0; q < size_; ++q)
                if (q != rank_) put(q, offset, buffers[q], len);
            });
    }
  } catch (...) {
    mark_broken();
    throw;
  }
}

void ShmTransport::reduce_scatter(const at::Tensor& output, const at::Tensor& input, const Combine& combine) {
  const at::Tensor rows = input.view({size_, -1}), out = output.view({-1});
  const int64_t chunk = rows.size(1), element = input.element_size();
  // A round carries one piece per destination rank, each cache-line aligned.
  const int64_t piece_bytes = buffer_bytes_ / size_ / 64 * 64;
  const int64_t piece = piece_bytes / element;
  std::vector<at::Tensor> pieces(static_cast<size_t>(size_));
  try {
    for (int64_t offset = 0; offset < chunk; offset += piece) {
      const int64_t len = std::min(piece, chunk - offset);
      round(
          [&](uint8_t* mine) {
            for (int q = 0; q < size_; ++q)
              if (q != rank_)
                std::memcpy(mine + q * piece_bytes, rows[q].narrow(0, offset, len).data_ptr(),
                            static_cast<size_t>(len * element));
          },
          [&](const std::vector<const uint8_t*>& buffers) {
            for (int q = 0; q < size_; ++q)
              pieces[q] = q == rank_ ? rows[rank_].narrow(0, offset, len)
                                     : at::from_blob(const_cast<uint8_t*>(buffers[q]) + rank_ * piece_bytes, {len},
                                                     input.options());
            combine(pieces, out.narrow(0, offset, len));
          });
    }
  } catch (...) {
    mark_broken();
    throw;
  }
}

void ShmTransport::all_reduce(const at::Tensor& tensor, const PlacedCombine& combine) {
  const at::Tensor flat = tensor.view({-1});
  const int64_t numel = flat.numel(), element = tensor.element_size();
  const int64_t piece = buffer_bytes_ / size_ / 64 * 64 / element;
  at::Tensor share = at::empty({piece}, tensor.options());
  std::vector<at::Tensor> pieces(static_cast<size_t>(size_));
  try {
    for (int64_t base = 0; base < numel; base += piece * size_) {
      // This round's range, cut into `size` pieces (the last ones shorter, or empty).
      const int64_t range = std::min(piece * size_, numel - base), cut = (range + size_ - 1) / size_;
      auto start = [&](int q) { return std::min<int64_t>(q * cut, range); };
      auto length = [&](int q) { return start(q + 1) - start(q); };
      const auto range_bytes = static_cast<size_t>(range * element);
      const int64_t mine = length(rank_);
      // Round 1: every rank posts the range; each reduces its piece of it.
      round([&](uint8_t* buffer) { std::memcpy(buffer, flat.narrow(0, base, range).data_ptr(), range_bytes); },
            [&](const std::vector<const uint8_t*>& buffers) {
              if (mine == 0) return;
              for (int q = 0; q < size_; ++q)
                pieces[q] = q == rank_ ? flat.narrow(0, base + start(rank_), mine)
                                       : at::from_blob(const_cast<uint8_t*>(buffers[q]) + start(rank_) * element,
                                                       {mine}, tensor.options());
              combine(base + start(rank_), pieces, share.narrow(0, 0, mine));
            });
      // Round 2: every rank posts its reduced piece; all copy the others'.
      round([&](uint8_t* buffer) { std::memcpy(buffer, share.data_ptr(), static_cast<size_t>(mine * element)); },
            [&](const std::vector<const uint8_t*>& buffers) {
              for (int q = 0; q < size_; ++q) {
                const at::Tensor dst = flat.narrow(0, base + start(q), length(q));
                if (length(q) == 0) continue;
                std::memcpy(dst.data_ptr(), q == rank_ ? share.data_ptr() : buffers[q],
                            static_cast<size_t>(length(q) * element));
              }
            });
    }
  } catch (...) {
    mark_broken();
    throw;
  }
}

ShmTransport* shm_transport(const ProcessGroupImpl& g) {
  if (!g.shm_decided) {
    g.shm_decided = true;  // once: a handshake that throws fails its collective, not a retry
    if (g.size() > 1) g.shm = make_transport(g);
  }
  return g.shm.get();
}

bool uses_shared_memory(const ProcessGroup& group) {
  return member_group(group, "uses_shared_memory").shm != nullptr;
}

}  // namespace fsdpp::detail

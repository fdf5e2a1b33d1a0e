// comm/device_stream.h: c10's streams and events on an accelerator, host queues on the CPU.
#include "comm/device_stream.h"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace fsdpp::detail {

// A CPU communication stream: a thread that runs what is queued, in order. Never destroyed (a
// thread blocked in a collective at exit must not be joined); their number is the number of comm
// streams made, a few per process group.
class HostQueue {
 public:
  HostQueue() { std::thread([this] { loop(); }).detach(); }

  // Returns the position just after `work`.
  int64_t enqueue(std::function<void()> work) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    cv_.notify_all();
    return ++queued_;
  }
  int64_t position() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queued_;
  }
  bool reached(int64_t position) {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ >= position;
  }
  bool wait_for(int64_t position, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto reached = [&] { return done_ >= position; };
    if (timeout.count() <= 0) {
      cv_.wait(lock, reached);
      return true;
    }
    return cv_.wait_for(lock, timeout, reached);
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        work();
      } catch (const std::exception& e) {  // a device would fault; the waits still end
        std::fprintf(stderr, "fsdpp: work on a CPU communication stream failed: %s\n", e.what());
      }
      work = nullptr;  // what it held goes before the position is reached
      std::lock_guard<std::mutex> lock(mutex_);
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  int64_t queued_ = 0, done_ = 0;
};

namespace {

const c10::Device kCpu(c10::DeviceType::CPU);

struct HostQueues {
  std::mutex mutex;
  std::unordered_map<c10::StreamId, std::shared_ptr<HostQueue>> by_id;
  c10::StreamId next_id = 1;  // 0 is the compute stream
};

HostQueues& host_queues() {
  static auto* queues = new HostQueues();  // outlives every thread that may use it at exit
  return *queues;
}

std::shared_ptr<HostQueue> host_queue(const c10::Stream& stream) {
  if (stream.device_type() != c10::DeviceType::CPU || stream.id() == 0) return nullptr;
  HostQueues& queues = host_queues();
  std::lock_guard<std::mutex> lock(queues.mutex);
  auto it = queues.by_id.find(stream.id());
  return it == queues.by_id.end() ? nullptr : it->second;
}

thread_local std::optional<c10::Stream> t_current_cpu_stream;

}  // namespace

c10::Stream current_stream(c10::Device device) {
  if (device.is_cpu()) return t_current_cpu_stream.value_or(c10::Stream(c10::Stream::DEFAULT, kCpu));
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

bool runs_on_caller(const c10::Stream& stream) {
  return stream.device_type() == c10::DeviceType::CPU && host_queue(stream) == nullptr;
}

c10::Stream new_comm_stream(c10::Device device) {
  if (device.is_cpu()) {
    HostQueues& queues = host_queues();
    std::lock_guard<std::mutex> lock(queues.mutex);
    const c10::StreamId id = queues.next_id++;
    queues.by_id.emplace(id, std::make_shared<HostQueue>());
    return c10::Stream(c10::Stream::UNSAFE, kCpu, id);
  }
  const c10::impl::VirtualGuardImpl impl(device.type());
  if (!device.has_index()) device = impl.getDevice();
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/true);
}

c10::Stream CommStream::on(c10::Device device) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stream_ || stream_->device_type() != device.type() || (device.has_index() && stream_->device() != device))
    stream_ = new_comm_stream(device);
  return *stream_;
}

StreamGuard::StreamGuard(const c10::Stream& stream) {
  if (stream.device_type() == c10::DeviceType::CPU) {
    previous_cpu_ = current_stream(kCpu);
    t_current_cpu_stream = stream;
  } else {
    device_.emplace(stream);
  }
}

StreamGuard::~StreamGuard() {
  if (previous_cpu_) t_current_cpu_stream = previous_cpu_;
}

void run_on_current_stream(c10::Device device, std::function<void()> work) {
  const std::shared_ptr<HostQueue> queue = device.is_cpu() ? host_queue(current_stream(device)) : nullptr;
  if (queue)
    queue->enqueue(std::move(work));
  else
    work();
}

at::Tensor kernel_argument(const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || t.data_ptr() == nullptr || runs_on_caller(current_stream(t.device()))) return t;
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options());
}

void release_after_stream(at::DataPtr ptr, const c10::Stream& stream) {
  if (ptr.get() == nullptr) return;
  if (stream.device_type() != c10::DeviceType::CPU) {
    c10::impl::VirtualGuardImpl(stream.device_type()).recordDataPtrOnStream(ptr, stream);
    return;  // the caching allocator keeps the block until the stream's work so far has run
  }
  if (const std::shared_ptr<HostQueue> queue = host_queue(stream))
    queue->enqueue([held = std::make_shared<at::DataPtr>(std::move(ptr))] {});
}

StreamEvent::StreamEvent(c10::DeviceType type) : type_(type) {
  if (type != c10::DeviceType::CPU) event_.emplace(type);
}

void StreamEvent::record(const c10::Stream& stream) {
  recorded_ = true;
  if (event_) {
    event_->record(stream);
    return;
  }
  queue_ = host_queue(stream);
  position_ = queue_ ? queue_->position() : 0;
}

void StreamEvent::block(const c10::Stream& stream) const {
  if (!recorded_) return;
  if (event_) {
    event_->block(stream);
    return;
  }
  if (!queue_) return;  // marked on the compute stream: already reached
  const std::shared_ptr<HostQueue> waiter = host_queue(stream);
  if (waiter == queue_) return;  // a stream runs in order
  if (!waiter) {
    queue_->wait_for(position_, std::chrono::milliseconds(0));
    return;
  }
  waiter->enqueue([queue = queue_, position = position_] { queue->wait_for(position, std::chrono::milliseconds(0)); });
}

bool StreamEvent::query() const {
  if (!recorded_) return true;
  if (event_) return event_->query();
  return !queue_ || queue_->reached(position_);
}

bool StreamEvent::synchronize(std::chrono::milliseconds timeout) const {
  if (!recorded_) return true;
  if (!event_) return !queue_ || queue_->wait_for(position_, timeout);
  if (timeout.count() <= 0) {
    event_->synchronize();
    return true;
  }
  // Polled: a device wait has no timeout of its own.
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!event_->query()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace fsdpp::detail

#include "fsdpp/summary_writer.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <system_error>

#include "fsdpp/error.h"
#include "metrics/event_file.h"

namespace fsdpp {
namespace {

// Protocol buffer encoding, by hand: the few messages of tensorboard/compat/proto/{event,summary,
// tensor,tensor_shape}.proto that a scalar and a text need.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (field << 3) | type); }
void put_int(std::string& out, uint32_t field, int64_t v) {  // int64 and enums: negatives take 10 bytes
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kBytes);
  put_varint(out, bytes.size());
  out.append(bytes);
}
void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}
void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// Event (event.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSessionLog = 7, kEventSourceMetadata = 10;
constexpr uint32_t kSessionLogStatus = 1, kSessionLogStart = 1, kSourceMetadataWriter = 1;
// Summary, Summary.Value, SummaryMetadata(.PluginData) (summary.proto).
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8,
                   kValueMetadata = 9, kMetadataPluginData = 1, kPluginDataPluginName = 1;
// TensorProto, TensorShapeProto(.Dim) (tensor.proto, tensor_shape.proto, types.proto).
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8, kDtString = 7,
                   kShapeDim = 2, kDimSize = 1;
constexpr std::string_view kFileVersion = "brain.Event:2";

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_int(event, kEventStep, step);
  return event;
}

std::string summary_event(double wall_time, int64_t step, std::string_view value) {
  std::string summary;
  put_bytes(summary, kSummaryValue, value);
  std::string event = event_header(wall_time, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

std::string text_value(const std::string& tag, const std::string& text) {
  std::string plugin_data, metadata, dim, shape, tensor, value;
  put_bytes(plugin_data, kPluginDataPluginName, "text");  // content: an empty TextPluginData
  put_bytes(metadata, kMetadataPluginData, plugin_data);
  put_int(dim, kDimSize, 1);
  put_bytes(shape, kShapeDim, dim);
  put_int(tensor, kTensorDtype, kDtString);
  put_bytes(tensor, kTensorShape, shape);
  put_bytes(tensor, kTensorStringVal, text);
  put_bytes(value, kValueTag, tag + "/text_summary");
  put_bytes(value, kValueTensor, tensor);  // field order as protobuf serializes it: 8 before 9
  put_bytes(value, kValueMetadata, metadata);
  return value;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

// As PyTorch's: one counter per process, so two writers of one process never share a file name.
std::atomic<int64_t> writer_counter{0};

std::string event_file_name(const std::string& suffix) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(now_seconds()));
  return "events.out.tfevents." + std::string(seconds) + "." + hostname() + "." +
         std::to_string(getpid()) + "." + std::to_string(writer_counter++) + suffix;
}

}  // namespace

struct SummaryWriter::Impl {
  std::string log_dir;
  SummaryWriterOptions options;
  std::unique_ptr<metrics::EventFile> file;
  std::string file_path;
  std::chrono::steady_clock::time_point last_flush = std::chrono::steady_clock::now();

  // Here, not in ~SummaryWriter, so that a move assignment flushes the writer it replaces.
  ~Impl() {
    if (!file) return;
    try {
      file->close();
    } catch (const std::exception& e) {
      std::cerr << "fsdpp::SummaryWriter: " << e.what() << std::endl;  // a destructor must not throw
    }
  }

  void add_event(const std::string& event) {
    if (!file->is_open()) throw Error("SummaryWriter for " + file_path + " is closed");
    file->append(event);
    const auto since_flush = std::chrono::steady_clock::now() - last_flush;
    if (static_cast<int>(file->pending_records()) >= options.max_queue() ||
        since_flush >= std::chrono::duration<double>(options.flush_secs())) {
      flush();
    }
  }
  void flush() {
    file->flush();
    last_flush = std::chrono::steady_clock::now();
  }
};

SummaryWriter::SummaryWriter(std::string log_dir, SummaryWriterOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->log_dir = std::move(log_dir);
  impl_->options = std::move(options);
  std::error_code error;
  std::filesystem::create_directories(impl_->log_dir, error);
  if (error || !std::filesystem::is_directory(impl_->log_dir)) {
    throw Error("cannot create the TensorBoard log folder " + impl_->log_dir + ": " +
                (error ? error.message() : "not a folder"));
  }
  impl_->file_path =
      (std::filesystem::path(impl_->log_dir) / event_file_name(impl_->options.filename_suffix())).string();
  impl_->file = std::make_unique<metrics::EventFile>(impl_->file_path);

  const double wall_time = now_seconds();
  std::string first, source;
  put_double(first, kEventWallTime, wall_time);
  put_bytes(first, kEventFileVersion, kFileVersion);
  put_bytes(source, kSourceMetadataWriter, "fsdpp");
  put_bytes(first, kEventSourceMetadata, source);
  impl_->file->append(first);
  if (impl_->options.purge_step()) {
    // As PyTorch: a SessionLog START at purge_step makes TensorBoard drop the events of steps
    // >= purge_step that it read before it (earlier files of this log_dir).
    std::string version = event_header(wall_time, *impl_->options.purge_step());
    put_bytes(version, kEventFileVersion, kFileVersion);
    std::string session_log, start = event_header(wall_time, *impl_->options.purge_step());
    put_int(session_log, kSessionLogStatus, kSessionLogStart);
    put_bytes(start, kEventSessionLog, session_log);
    impl_->file->append(version);
    impl_->file->append(start);
  }
  impl_->flush();  // the file is valid (and any write error shows) from the start
}

SummaryWriter::~SummaryWriter() = default;

SummaryWriter::SummaryWriter(SummaryWriter&&) noexcept = default;
SummaryWriter& SummaryWriter::operator=(SummaryWriter&&) noexcept = default;

void SummaryWriter::add_scalar(const std::string& tag, double value, int64_t step,
                               std::optional<double> wall_time) {
  std::string summary_value;
  put_bytes(summary_value, kValueTag, tag);
  put_float(summary_value, kValueSimpleValue, static_cast<float>(value));
  impl_->add_event(summary_event(wall_time.value_or(now_seconds()), step, summary_value));
}

void SummaryWriter::add_text(const std::string& tag, const std::string& text, int64_t step,
                             std::optional<double> wall_time) {
  impl_->add_event(summary_event(wall_time.value_or(now_seconds()), step, text_value(tag, text)));
}

void SummaryWriter::flush() { impl_->flush(); }
void SummaryWriter::close() { impl_->file->close(); }
const std::string& SummaryWriter::log_dir() const { return impl_->log_dir; }
const std::string& SummaryWriter::file_path() const { return impl_->file_path; }

}  // namespace fsdpp

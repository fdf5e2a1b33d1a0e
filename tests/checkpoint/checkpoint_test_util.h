#pragma once
// Helpers of the Checkpoint and Safetensors tests: the stdlib-only Python reader, the fsdpp-ckpt
// tool next to the test binary, raw bytes of tensors, hand edits of a checkpoint's metadata.
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

namespace fsdpp::testing {

inline std::string hex_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < c.nbytes(); ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

// Runs a shell command; returns its stdout and sets `status` to its exit code.
inline std::string run_command(const std::string& command, int& status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) {
    status = -1;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(pipe);
  status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

// The Python whose torch matches the libtorch under test (CMake's FSDPP_PYTHON), with safetensors,
// quoted for a shell command line.
inline std::string python() { return "'" FSDPP_TEST_PYTHON "'"; }

inline std::string python_tool() {
  return (std::filesystem::path(__FILE__).parent_path() / "safetensors_tool.py").string();
}

// tools/fsdpp-ckpt of the same build tree as this test binary.
inline std::string ckpt_tool() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / "tools" / "fsdpp-ckpt")
      .string();
}

// Rewrites dir/metadata.json after `edit` changed its JSON (a hand-made corrupt checkpoint).
inline void edit_metadata(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  const std::string path = dir + "/metadata.json";
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)), {}));
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump(1);
}

// Replaces dir/metadata.json with `text` verbatim (for numbers nlohmann would not write).
inline void write_metadata_text(const std::string& dir, const std::string& text) {
  std::ofstream(dir + "/metadata.json", std::ios::trunc) << text;
}

inline std::string read_metadata_text(const std::string& dir) {
  std::ifstream in(dir + "/metadata.json");
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace fsdpp::testing

// The fuzzer's scratch directory.
#include "scratch_dir.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fsdpp_fuzz {

namespace fs = std::filesystem;

const std::string& scratch_dir() {
  // Never destroyed: the atexit handler below runs after static destructors would have.
  static const std::string* const dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    auto* d = new std::string(std::string(tmp && *tmp ? tmp : "/tmp") + "/fsdpp-fuzz-" + std::to_string(::getpid()));
    fs::remove_all(*d);
    fs::create_directories(*d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return *dir;
}

std::string write_scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) {
    std::perror(path.c_str());
    std::abort();  // the harness, not the code under test, failed
  }
  return path;
}

std::string write_scratch_file(const std::string& name, const std::string& bytes) {
  return write_scratch_file(name, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

void remove_scratch_file(const std::string& name) {
  std::error_code ec;
  fs::remove(scratch_dir() + "/" + name, ec);
}

}  // namespace fsdpp_fuzz

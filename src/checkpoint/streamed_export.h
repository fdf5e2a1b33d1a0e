#pragma once
// The streamed export's core (export_safetensors.cpp), shared by export_safetensors (one file)
// and export_huggingface (a directory of shard files and an index).
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include <fsdpp/state_dict_container.h>

namespace torch::nn {
class Module;
}

namespace fsdpp::checkpoint::detail {

// What rank 0 wrote, once every file is in place.
struct ExportedFiles {
  std::vector<std::string> files;                 // paths, in order
  std::map<std::string, std::string> file_of;     // key -> the file name (no folder) holding it
  int64_t total_bytes = 0;                        // tensor bytes
};

struct ExportTarget {
  std::string api;    // names the call in errors
  std::string where;  // the file or folder, in errors
  // File i of n's path (n is 1 when max_file_bytes is 0).
  std::function<std::string(int i, int n)> file_name;
  int64_t max_file_bytes = 0;  // tensor bytes per file; a larger tensor gets a file of its own
  std::optional<at::ScalarType> dtype;  // floating tensors are written in it
  std::set<std::string> skip;           // keys not written
  std::map<std::string, std::string> metadata;  // each file's __metadata__ ("format": "pt" added)
  // Rank 0, once every file is written and synced, before they are renamed into place (the
  // paths, in order); then after they are in place. What either throws fails the export on
  // every rank.
  std::function<void(const std::vector<std::string>&)> before_rename;
  std::function<void(const ExportedFiles&)> after_commit;
};

// Collective over the default group (every rank of it calls with its own dict).
void export_files(const StateDict& sd, const ExportTarget& target);

// A live model's SHARDED state dict without copies (each sharded parameter's part as a
// ShardedTensor view, every other entry the module's own tensor). `aliases`, when given,
// receives each key of a tensor registered under an earlier key too (tied weights), mapped to
// that earlier key.
StateDict shared_state_dict(torch::nn::Module& model, std::map<std::string, std::string>* aliases = nullptr);

}  // namespace fsdpp::checkpoint::detail

#include "tokenizer_config.h"

#include <filesystem>

#include "json_util.h"

namespace fsdpp::tokenizer_detail {
namespace {

// A token is a string, null, or an AddedToken object {"content": ...}.
std::optional<std::string> token_of(const JsonAt& root, const char* key) {
  if (!root.has(key)) return std::nullopt;
  const JsonAt v = root.child(key);
  if (v.value.is_string()) return v.value.get<std::string>();
  if (v.value.is_object()) return v.child("content").string();
  v.fail("is neither a string nor an object with \"content\"");
}

std::optional<bool> flag_of(const JsonAt& root, const char* key) {
  if (!root.has(key)) return std::nullopt;
  return root.boolean_or(key, false);
}

}  // namespace

TokenizerConfig TokenizerConfig::load(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerConfig c;
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config)) {
    c.file = config.string();
    const Json json = read_json_file(c.file);
    const JsonAt root{json, c.file, ""};
    if (!json.is_object()) root.fail("the file is not a JSON object");
    c.bos_token = token_of(root, "bos_token");
    c.eos_token = token_of(root, "eos_token");
    c.pad_token = token_of(root, "pad_token");
    c.add_bos_token = flag_of(root, "add_bos_token");
    c.add_eos_token = flag_of(root, "add_eos_token");
  }
  const fs::path map = fs::path(dir) / "special_tokens_map.json";
  if (fs::exists(map)) {
    const Json json = read_json_file(map.string());
    const JsonAt root{json, map.string(), ""};
    if (!json.is_object()) root.fail("the file is not a JSON object");
    if (c.file.empty()) c.file = map.string();
    if (!c.bos_token) c.bos_token = token_of(root, "bos_token");
    if (!c.eos_token) c.eos_token = token_of(root, "eos_token");
    if (!c.pad_token) c.pad_token = token_of(root, "pad_token");
  }
  return c;
}

}  // namespace fsdpp::tokenizer_detail

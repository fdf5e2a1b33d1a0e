#include "json_util.h"

#include <fsdpp/error.h>

#include <fstream>
#include <sstream>

namespace fsdpp::tokenizer_detail {

Json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("tokenizer: cannot read " + path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return Json::parse(buffer.str());
  } catch (const Json::exception& e) {
    throw Error("tokenizer: " + path + " is not valid JSON: " + e.what());
  }
}

void json_fail(const std::string& file, const std::string& field, const std::string& why) {
  throw Error("tokenizer: " + file + ": field " + field + ": " + why);
}

JsonAt JsonAt::child(const char* key) const {
  if (!value.is_object()) fail("is not an object");
  const auto it = value.find(key);
  const std::string path = field.empty() ? key : field + "." + key;
  if (it == value.end()) json_fail(file, path, "is missing");
  return JsonAt{*it, file, path};
}

JsonAt JsonAt::child_or_null(const char* key) const {
  static const Json null;
  if (value.is_object() && value.contains(key)) return child(key);
  return JsonAt{null, file, field.empty() ? key : field + "." + key};
}

bool JsonAt::has(const char* key) const {
  if (!value.is_object()) return false;
  const auto it = value.find(key);
  return it != value.end() && !it->is_null();
}

JsonAt JsonAt::at(size_t index) const {
  return JsonAt{value.at(index), file, field + "[" + std::to_string(index) + "]"};
}

std::string JsonAt::string() const {
  if (!value.is_string()) fail("is not a string");
  return value.get<std::string>();
}

bool JsonAt::boolean_or(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const JsonAt v = child(key);
  if (!v.value.is_boolean()) v.fail("is not a boolean");
  return v.value.get<bool>();
}

int64_t JsonAt::integer() const {
  if (!value.is_number_integer()) fail("is not an integer");
  return value.get<int64_t>();
}

}  // namespace fsdpp::tokenizer_detail

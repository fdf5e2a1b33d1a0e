#pragma once
// Reading the tokenizer's JSON files, with errors that name the file and the field.
#include <nlohmann/json.hpp>
#include <string>

namespace fsdpp::tokenizer_detail {

using Json = nlohmann::json;

// Parses a JSON file; throws fsdpp::Error naming the file when it is unreadable or malformed.
Json read_json_file(const std::string& path);

// Throws fsdpp::Error: "<file>: field <field>: <why>".
[[noreturn]] void json_fail(const std::string& file, const std::string& field, const std::string& why);

// Where a value sits: the file, and the path of the field inside it ("model.vocab").
struct JsonAt {
  const Json& value;
  std::string file;
  std::string field;

  JsonAt child(const char* key) const;                  // required member
  JsonAt child_or_null(const char* key) const;          // optional member: a null value if absent
  bool has(const char* key) const;                      // present and not null
  JsonAt at(size_t index) const;                        // array element
  std::string string() const;                           // the value, which must be a string
  bool boolean_or(const char* key, bool fallback) const;  // optional bool member
  int64_t integer() const;
  [[noreturn]] void fail(const std::string& why) const { json_fail(file, field, why); }
};

}  // namespace fsdpp::tokenizer_detail

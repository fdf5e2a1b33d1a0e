#pragma once
// tokenizer.json's "pre_tokenizer": cuts normalized text into the pieces the BPE model sees.
// Supported: ByteLevel (GPT-2: its regex when use_regex, add_prefix_space), Split (a Regex or
// String pattern, behavior "Isolated", invert false: Llama 3, Qwen2), a Sequence of those, or
// null. Other types and behaviors are refused, naming the file and field.
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "json_util.h"
#include "regex.h"

namespace fsdpp::tokenizer_detail {

class PreTokenizer {
 public:
  static PreTokenizer from_json(const JsonAt& at);

  // Calls `emit` with each non-empty piece of `text`, in order. After a ByteLevel step the
  // pieces are in the byte-to-unicode mapped form.
  void for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const;

  // True when a ByteLevel step maps the text (then the vocabulary is byte-level).
  bool byte_level() const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;  // Split, or ByteLevel with use_regex; may be null
    bool byte_level = false;
    bool add_prefix_space = false;
  };
  void add_steps(const JsonAt& at);
  void run(size_t step, std::string_view text, const std::function<void(std::string_view)>& emit) const;

  std::vector<Step> steps_;
};

}  // namespace fsdpp::tokenizer_detail

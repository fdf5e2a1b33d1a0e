#pragma once
// tokenizer.json's "post_processor", for a single sequence: the ids it puts before and after
// the text's ids. Supported: null, ByteLevel (adds nothing), TemplateProcessing (its "single"
// template, with one $A), and a Sequence of those. Others (BertProcessing, RobertaProcessing)
// are refused, naming the file and field.
#include <cstdint>
#include <vector>

#include "json_util.h"

namespace fsdpp::tokenizer_detail {

struct PostProcessor {
  std::vector<int64_t> prefix, suffix;
  bool has_template = false;  // a TemplateProcessing decides on special tokens

  static PostProcessor from_json(const JsonAt& at);

 private:
  void add(const JsonAt& at);
};

}  // namespace fsdpp::tokenizer_detail

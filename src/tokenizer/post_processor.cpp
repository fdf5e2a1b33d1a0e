#include "post_processor.h"

namespace fsdpp::tokenizer_detail {

PostProcessor PostProcessor::from_json(const JsonAt& at) {
  PostProcessor p;
  if (!at.value.is_null()) p.add(at);
  return p;
}

void PostProcessor::add(const JsonAt& at) {
  const std::string type = at.child("type").string();
  if (type == "ByteLevel") return;  // only trims offsets, which fsdpp does not report
  if (type == "Sequence") {
    const JsonAt list = at.child("processors");
    for (size_t i = 0; i < list.value.size(); ++i) add(list.at(i));
    return;
  }
  if (type != "TemplateProcessing") {
    at.child("type").fail("post_processor type '" + type +
                          "' is not supported (only TemplateProcessing, ByteLevel, Sequence)");
  }
  if (has_template) at.fail("a second TemplateProcessing is not supported");
  has_template = true;
  const JsonAt single = at.child("single");
  const JsonAt specials = at.child("special_tokens");
  bool seen_a = false;
  for (size_t i = 0; i < single.value.size(); ++i) {
    const JsonAt item = single.at(i);
    if (item.has("Sequence")) {
      const std::string id = item.child("Sequence").child("id").string();
      if (id != "A" || seen_a) item.fail("the single template must hold $A once");
      seen_a = true;
    } else if (item.has("SpecialToken")) {
      const JsonAt name = item.child("SpecialToken").child("id");
      const JsonAt entry = specials.child(name.string().c_str());
      const JsonAt ids = entry.child("ids");
      for (size_t k = 0; k < ids.value.size(); ++k) (seen_a ? suffix : prefix).push_back(ids.at(k).integer());
    } else {
      item.fail("is neither a Sequence nor a SpecialToken");
    }
  }
  if (!seen_a) single.fail("the single template has no $A");
}

}  // namespace fsdpp::tokenizer_detail

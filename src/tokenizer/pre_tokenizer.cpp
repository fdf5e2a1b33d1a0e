#include "pre_tokenizer.h"

#include "byte_level.h"

namespace fsdpp::tokenizer_detail {
namespace {

// A Split's {"String": s} pattern matches s literally (tokenizers escapes it). Only the
// metacharacters are escaped: in Oniguruma some escaped letters or symbols mean something.
std::string escape_literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\.^$|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const JsonAt& at) {
  PreTokenizer p;
  if (!at.value.is_null()) p.add_steps(at);
  return p;
}

void PreTokenizer::add_steps(const JsonAt& at) {
  const std::string type = at.child("type").string();
  const std::string where = at.file + ": field " + at.field;
  if (type == "Sequence") {
    const JsonAt list = at.child("pretokenizers");
    for (size_t i = 0; i < list.value.size(); ++i) add_steps(list.at(i));
  } else if (type == "ByteLevel") {
    Step s;
    s.byte_level = true;
    s.add_prefix_space = at.boolean_or("add_prefix_space", true);
    if (at.boolean_or("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, where);
    steps_.push_back(std::move(s));
  } else if (type == "Split") {
    const JsonAt behavior = at.child("behavior");
    if (behavior.string() != "Isolated") {
      behavior.fail("Split behavior '" + behavior.string() + "' is not supported (only Isolated)");
    }
    if (at.boolean_or("invert", false)) at.child("invert").fail("Split with invert true is not supported");
    const JsonAt pattern = at.child("pattern");
    Step s;
    if (pattern.has("Regex")) {
      s.regex = std::make_shared<Regex>(pattern.child("Regex").string(), where + ".pattern.Regex");
    } else if (pattern.has("String")) {
      s.regex = std::make_shared<Regex>(escape_literal(pattern.child("String").string()), where + ".pattern.String");
    } else {
      pattern.fail("is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    steps_.push_back(std::move(s));
  } else {
    at.child("type").fail("pre_tokenizer type '" + type +
                          "' is not supported (only ByteLevel, Split, Sequence)");
  }
}

bool PreTokenizer::byte_level() const {
  for (const Step& s : steps_) {
    if (s.byte_level) return true;
  }
  return false;
}

void PreTokenizer::for_each_piece(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (!text.empty()) run(0, text, emit);
}

void PreTokenizer::run(size_t step, std::string_view text, const std::function<void(std::string_view)>& emit) const {
  if (step == steps_.size()) {
    emit(text);
    return;
  }
  const Step& s = steps_[step];
  std::string prefixed;
  if (s.add_prefix_space && text.front() != ' ') {  // per piece, as tokenizers does
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  std::vector<std::pair<size_t, size_t>> matches;
  if (s.regex) {
    s.regex->find_all(text, matches);
  } else {
    matches.emplace_back(0, text.size());
  }
  // Isolated: each match is a piece, and so is each stretch between matches.
  std::string mapped;
  const auto next = [&](size_t b, size_t e) {
    if (b == e) return;
    const std::string_view piece = text.substr(b, e - b);
    if (!s.byte_level) {
      run(step + 1, piece, emit);
      return;
    }
    mapped.clear();
    byte_level_encode(piece, mapped);
    run(step + 1, mapped, emit);
  };
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    next(prev, b);
    next(b, e);
    prev = e;
  }
  next(prev, text.size());
}

}  // namespace fsdpp::tokenizer_detail

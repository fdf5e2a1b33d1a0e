#include "regex.h"

#include <fsdpp/error.h>
#include <oniguruma.h>

#include <mutex>

namespace fsdpp::tokenizer_detail {
namespace {

void init_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

const UChar* bytes(std::string_view s) { return reinterpret_cast<const UChar*>(s.data()); }

// A region per call keeps searches on one shared regex thread-safe.
struct Region {
  OnigRegion* r = onig_region_new();
  ~Region() { onig_region_free(r, 1); }
};

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : regex_(nullptr) {
  init_oniguruma();
  OnigRegex reg = nullptr;
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const UChar*>(pattern.data());
  const int rc = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                          ONIG_SYNTAX_DEFAULT, &info);
  if (rc != ONIG_NORMAL) {
    UChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    throw Error("tokenizer: " + where + ": bad regex '" + pattern + "': " + reinterpret_cast<char*>(message));
  }
  regex_ = reg;
}

Regex::~Regex() { onig_free(static_cast<OnigRegex>(regex_)); }

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  auto* reg = static_cast<OnigRegex>(regex_);
  Region region;
  const UChar* begin = bytes(text);
  const UChar* end = begin + text.size();
  size_t pos = 0;
  while (pos <= text.size()) {
    const int at = onig_search(reg, begin, end, begin + pos, end, region.r, ONIG_OPTION_NONE);
    if (at == ONIG_MISMATCH) break;
    if (at < 0) throw Error("tokenizer: regex search failed with Oniguruma code " + std::to_string(at));
    const auto b = static_cast<size_t>(region.r->beg[0]);
    const auto e = static_cast<size_t>(region.r->end[0]);
    if (e == b) {
      // An empty match: skip one character, as the onig crate's find_iter does; not reported,
      // since tokenizers drops empty splits.
      if (b >= text.size()) break;
      const auto lead = static_cast<unsigned char>(text[b]);
      pos = b + (lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4);
      continue;
    }
    out.emplace_back(b, e);
    pos = e;
  }
}

bool Regex::matches_at_start(std::string_view text) const {
  Region region;
  const UChar* begin = bytes(text);
  const UChar* end = begin + text.size();
  return onig_match(static_cast<OnigRegex>(regex_), begin, end, begin, region.r, ONIG_OPTION_NONE) >= 0;
}

}  // namespace fsdpp::tokenizer_detail

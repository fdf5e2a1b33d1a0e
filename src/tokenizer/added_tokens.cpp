#include "added_tokens.h"

#include <algorithm>

#include "utf8.h"

namespace fsdpp::tokenizer_detail {
namespace {

size_t utf8_char_len_at(std::string_view s, size_t pos) {
  return utf8_char_len(static_cast<unsigned char>(s[pos]));
}

size_t prev_char_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

}  // namespace

void AddedTokens::Trie::insert(std::string_view s, int32_t token) {
  int32_t node = 0;
  for (unsigned char c : s) {
    auto it = nodes[static_cast<size_t>(node)].next.find(c);
    if (it == nodes[static_cast<size_t>(node)].next.end()) {
      nodes.push_back(Node{});
      it = nodes[static_cast<size_t>(node)].next.emplace(c, static_cast<int32_t>(nodes.size() - 1)).first;
    }
    node = it->second;
  }
  nodes[static_cast<size_t>(node)].token = token;
}

std::pair<int32_t, size_t> AddedTokens::Trie::longest_at(std::string_view text, size_t pos) const {
  std::pair<int32_t, size_t> best{-1, 0};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto& next = nodes[static_cast<size_t>(node)].next;
    const auto it = next.find(static_cast<unsigned char>(text[i]));
    if (it == next.end()) break;
    node = it->second;
    if (nodes[static_cast<size_t>(node)].token >= 0) best = {nodes[static_cast<size_t>(node)].token, i + 1 - pos};
  }
  return best;
}

AddedTokens::AddedTokens(const JsonAt& at, const Normalizer& normalizer) {
  if (!at.value.is_null() && !at.value.is_array()) at.fail("is not an array");
  for (size_t i = 0; i < at.value.size(); ++i) {
    const JsonAt t = at.at(i);
    AddedToken a;
    a.content = t.child("content").string();
    a.id = t.child("id").integer();
    if (a.id < 0) t.child("id").fail("is negative");
    if (a.content.empty()) t.child("content").fail("is empty");
    a.special = t.boolean_or("special", false);
    a.normalized = t.boolean_or("normalized", true);  // tokenizers' serde default
    a.lstrip = t.boolean_or("lstrip", false);
    a.rstrip = t.boolean_or("rstrip", false);
    a.single_word = t.boolean_or("single_word", false);
    const auto index = static_cast<int32_t>(tokens_.size());
    if (a.normalized) {
      normalized_trie_.insert(normalizer.apply(a.content), index);
      any_normalized_ = true;
    } else {
      raw_trie_.insert(a.content, index);
    }
    by_content_[a.content] = tokens_.size();
    by_id_[a.id] = tokens_.size();
    tokens_.push_back(std::move(a));
  }
  // The classes of tokenizers' \w and \s (the Rust regex crate's Unicode definitions, which
  // differ from Oniguruma's \w: Alphabetic rather than L, Nd rather than N, and Join_Control).
  word_char_ = std::make_unique<Regex>(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", at.file + ": single_word");
  space_char_ = std::make_unique<Regex>(R"(\p{White_Space})", at.file + ": lstrip/rstrip");
}

const AddedToken* AddedTokens::find(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedTokens::find(int64_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::vector<Segment> AddedTokens::split(std::string_view text, const Normalizer& normalizer) const {
  std::vector<Segment> raw, out;
  find_matches(text, raw_trie_, raw);
  for (Segment& s : raw) {
    if (s.id) {
      out.push_back(std::move(s));
    } else if (any_normalized_) {
      find_matches(normalizer.apply(s.text), normalized_trie_, out);
    } else {
      out.push_back(Segment{normalizer.apply(s.text), std::nullopt});
    }
  }
  return out;
}

// tokenizers' AddedVocabulary::find_matches, on one piece of text.
void AddedTokens::find_matches(std::string_view text, const Trie& trie, std::vector<Segment>& out) const {
  const auto is_word = [&](std::string_view s, size_t begin, size_t end) {
    return word_char_->matches_at_start(s.substr(begin, end - begin));
  };
  const auto is_space_at = [&](size_t pos) {
    const size_t len = utf8_char_len_at(text, pos);
    return space_char_->matches_at_start(text.substr(pos, len));
  };
  size_t emitted = 0;  // end of what is already in `out`
  size_t pos = 0;
  while (pos < text.size() && trie.nodes.size() > 1) {
    const auto [index, len] = trie.longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[static_cast<size_t>(index)];
    size_t start = pos, stop = pos + len;
    pos = stop;
    if (token.single_word) {
      const bool word_before = start > 0 && is_word(text, prev_char_start(text, start), start);
      const bool word_after = stop < text.size() && is_word(text, stop, stop + utf8_char_len_at(text, stop));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0 && is_space_at(prev_char_start(text, s))) s = prev_char_start(text, s);
      start = std::max(s, emitted);
    }
    if (token.rstrip) {
      while (stop < text.size() && is_space_at(stop)) stop += utf8_char_len_at(text, stop);
    }
    if (emitted < start) out.push_back(Segment{std::string(text.substr(emitted, start - emitted)), std::nullopt});
    out.push_back(Segment{std::string(text.substr(start, stop - start)), token.id});
    emitted = stop;
  }
  if (emitted < text.size()) out.push_back(Segment{std::string(text.substr(emitted)), std::nullopt});
}

}  // namespace fsdpp::tokenizer_detail

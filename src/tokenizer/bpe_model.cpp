#include "bpe_model.h"

#include <queue>

#include "utf8.h"

namespace fsdpp::tokenizer_detail {

std::unique_ptr<BpeModel> BpeModel::from_json(const JsonAt& at) {
  auto m = std::make_unique<BpeModel>();
  const std::string type = at.has("type") ? at.child("type").string() : "BPE";
  if (type != "BPE") at.child("type").fail("model type '" + type + "' is not supported (only BPE)");
  if (at.has("dropout") && at.child("dropout").value.get<double>() != 0.0) {
    at.child("dropout").fail("BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (at.has(key) && !at.child(key).string().empty()) at.child(key).fail("is not supported");
  }
  if (at.boolean_or("byte_fallback", false)) at.child("byte_fallback").fail("byte_fallback is not supported");
  m->ignore_merges_ = at.boolean_or("ignore_merges", false);
  m->fuse_unk_ = at.boolean_or("fuse_unk", false);

  const JsonAt vocab = at.child("vocab");
  if (!vocab.value.is_object()) vocab.fail("is not an object of token: id");
  for (const auto& [token, id_json] : vocab.value.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > INT32_MAX) {
      json_fail(vocab.file, vocab.field + "[\"" + token + "\"]", "is not a valid id");
    }
    const auto id = id_json.get<int32_t>();
    m->vocab_[token] = id;
    if (static_cast<size_t>(id) >= m->tokens_.size()) m->tokens_.resize(static_cast<size_t>(id) + 1);
    m->tokens_[static_cast<size_t>(id)] = token;
  }

  const JsonAt merges = at.child("merges");
  if (!merges.value.is_array()) merges.fail("is not an array");
  m->merges_.reserve(merges.value.size());
  for (size_t rank = 0; rank < merges.value.size(); ++rank) {
    const JsonAt merge = merges.at(rank);
    std::string a, b;
    if (merge.value.is_string()) {  // "a b"
      const std::string s = merge.value.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        merge.fail("is not of the form \"a b\"");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (merge.value.is_array() && merge.value.size() == 2) {  // ["a", "b"]
      a = merge.at(0).string();
      b = merge.at(1).string();
    } else {
      merge.fail("is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = m->vocab_.find(a), ib = m->vocab_.find(b), iab = m->vocab_.find(a + b);
    if (ia == m->vocab_.end() || ib == m->vocab_.end() || iab == m->vocab_.end()) {
      merge.fail("merges '" + a + "' and '" + b + "', which are not both in the vocabulary with their merge");
    }
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    m->merges_[pair_key(ia->second, ib->second)] = Merge{static_cast<int32_t>(rank), iab->second};
  }

  if (at.has("unk_token")) {
    const JsonAt unk = at.child("unk_token");
    const auto it = m->vocab_.find(unk.string());
    if (it == m->vocab_.end()) unk.fail("'" + unk.string() + "' is not in the vocabulary");
    m->unk_id_ = it->second;
  }
  return m;
}

std::optional<int64_t> BpeModel::token_to_id(std::string_view token) const {
  const auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= size()) return nullptr;
  const std::string& t = tokens_[static_cast<size_t>(id)];
  return t.empty() ? nullptr : &t;
}

void BpeModel::tokenize(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {  // Llama 3: a pre-token in the vocabulary is one token
    if (const auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    const auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(std::string(word), std::move(ids));
  }
}

// tokenizers' Word::merge_all: a min-heap of (rank, position) over adjacent pairs, symbols in a
// doubly linked list; stale heap entries are recognised by the pair no longer merging to new_id.
void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  std::string ch;
  for (size_t i = 0; i < word.size();) {
    const size_t start = i;
    i += utf8_char_len(static_cast<unsigned char>(word[i]));
    ch.assign(word.data() + start, i - start);
    const auto it = vocab_.find(ch);
    int32_t id;
    if (it != vocab_.end()) {
      id = it->second;
    } else if (unk_id_) {
      if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unk_id_) continue;
      id = *unk_id_;
    } else {
      continue;  // no unk_token: tokenizers drops the character
    }
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Entry {
    int32_t rank, pos, new_id;
    bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
  const auto find = [&](int32_t a, int32_t b) -> const Merge* {
    const auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* m = find(symbols[i].id, symbols[i + 1].id)) {
      queue.push(Entry{m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Entry top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    const Symbol right = symbols[static_cast<size_t>(left.next)];
    const Merge* m = find(left.id, right.id);
    if (m == nullptr || m->new_id != top.new_id) continue;  // stale entry

    left.id = top.new_id;
    symbols[static_cast<size_t>(left.next)].alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* pm = find(symbols[static_cast<size_t>(left.prev)].id, left.id)) {
        queue.push(Entry{pm->rank, left.prev, pm->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* nm = find(left.id, symbols[static_cast<size_t>(left.next)].id)) {
        queue.push(Entry{nm->rank, top.pos, nm->new_id});
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids.push_back(s.id);
  }
}

}  // namespace fsdpp::tokenizer_detail

// fsdpp::Tokenizer against Hugging Face tokenizers and sentencepiece, id for id.
//
// The reference tests read the folder written by tests/tokenizer/tokenizer_reference.py, named
// by the environment variable FSDPP_TOKENIZER_REF:
//   python tests/tokenizer/tokenizer_reference.py /tmp/tokref
//   FSDPP_TOKENIZER_REF=/tmp/tokref ./test_tokenizer
// Without it (or without the folder) they are skipped; the unit tests below them need no Python.
#include <fsdpp/tokenizer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <functional>
#include <unistd.h>

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string show(const std::vector<int64_t>& ids, size_t from, size_t to) {
  std::string s = "[";
  for (size_t i = from; i < std::min(to, ids.size()); ++i) s += (i > from ? " " : "") + std::to_string(ids[i]);
  return s + (to < ids.size() ? " ...]" : "]");
}

// "" when equal, else where and how they differ.
std::string compare_ids(const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  const size_t from = i > 5 ? i - 5 : 0;
  return "first difference at id " + std::to_string(i) + " (of " + std::to_string(got.size()) + " vs " +
         std::to_string(want.size()) + "): fsdpp " + show(got, from, i + 6) + ", python " + show(want, from, i + 6);
}

const char* reference_dir() {
  const char* dir = std::getenv("FSDPP_TOKENIZER_REF");
  return dir != nullptr && fs::exists(fs::path(dir) / "manifest.json") ? dir : nullptr;
}

struct Corpus {
  std::string bytes;
  std::vector<std::string_view> chunks;
};

const Corpus& corpus(const fs::path& dir) {
  static Corpus c = [&] {
    Corpus r;
    r.bytes = read_file(dir / "corpus.bin");
    const json idx = json::parse(read_file(dir / "chunks.json"));
    for (size_t i = 0; i < idx["offsets"].size(); ++i) {
      r.chunks.emplace_back(r.bytes.data() + idx["offsets"][i].get<size_t>(), idx["lengths"][i].get<size_t>());
    }
    return r;
  }();
  return c;
}

std::optional<int64_t> opt(const json& j) {
  return j.is_null() ? std::nullopt : std::optional<int64_t>(j.get<int64_t>());
}

// Every chunk's ids with and without special tokens, the decodes, the special ids.
void check_reference(const std::string& name, const std::string& tokenizer_path = "") {
  const char* dir = reference_dir();
  if (dir == nullptr) GTEST_SKIP() << "FSDPP_TOKENIZER_REF is unset or has no manifest.json: run "
                                      "tests/tokenizer/tokenizer_reference.py DIR and set FSDPP_TOKENIZER_REF=DIR";
  const json ref = json::parse(read_file(fs::path(dir) / (name + ".ref.json")));
  const auto tok =
      fsdpp::Tokenizer::from_pretrained(tokenizer_path.empty() ? (fs::path(dir) / name).string() : tokenizer_path);
  const Corpus& c = corpus(dir);
  ASSERT_EQ(ref["ids"].size(), c.chunks.size());

  EXPECT_EQ(tok.vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(tok.bos_token_id(), opt(ref["bos"]));
  EXPECT_EQ(tok.eos_token_id(), opt(ref["eos"]));
  EXPECT_EQ(tok.pad_token_id(), opt(ref["pad"]));
  for (const auto& [token, id] : ref["tokens"].items()) {
    EXPECT_EQ(tok.token_to_id(token), id.get<int64_t>()) << token;
    EXPECT_EQ(tok.id_to_token(id.get<int64_t>()), token);
  }

  // SentencePiece unigram: releases break Viterbi ties differently, so a different segmentation
  // of the same text with the same total score (to float rounding) counts as a tie, not a failure.
  // (Debian's C++ library is 0.1.97, the Python wheel 0.2.x; the BPE models agree exactly.)
  const auto same_best_path = [&](const std::vector<int64_t>& got, const std::vector<int64_t>& want) {
    if (!ref.contains("scores")) return false;
    std::string text_got, text_want;
    double score_got = 0, score_want = 0;
    for (int64_t id : got) text_got += tok.id_to_token(id), score_got += ref["scores"][id].get<double>();
    for (int64_t id : want) text_want += tok.id_to_token(id), score_want += ref["scores"][id].get<double>();
    // sentencepiece sums scores in float along the path: near-ties within float rounding of the
    // running sum count too.
    return text_got == text_want && std::abs(score_got - score_want) < 1e-3 + 2e-7 * std::abs(score_want);
  };
  size_t agree = 0, ties = 0, bytes = 0, failures = 0;
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    const auto got = tok.encode(c.chunks[i], true), got_plain = tok.encode(c.chunks[i], false);
    const auto want = ref["ids"][i].get<std::vector<int64_t>>(), want_plain = ref["ids_plain"][i].get<std::vector<int64_t>>();
    const std::string a = compare_ids(got, want);
    const std::string b = compare_ids(got_plain, want_plain);
    if (a.empty() && b.empty()) {
      ++agree;
      bytes += c.chunks[i].size();
    } else if (same_best_path(got, want) && same_best_path(got_plain, want_plain)) {
      ++ties;
    } else if (++failures <= 3) {
      ADD_FAILURE() << name << ": chunk " << i << " (" << c.chunks[i].size() << " bytes: \""
                    << std::string(c.chunks[i].substr(0, 200)) << "\"): " << (a.empty() ? b : a);
    }
  }
  EXPECT_EQ(failures, 0u);

  size_t decodes = 0, decode_failures = 0;
  for (const json& d : ref["decode"]) {
    const std::string got = tok.decode(d["ids"].get<std::vector<int64_t>>(), d["skip"].get<bool>());
    if (got == d["text"].get<std::string>()) {
      ++decodes;
    } else if (++decode_failures <= 3) {
      ADD_FAILURE() << name << ": decode of " << show(d["ids"].get<std::vector<int64_t>>(), 0, 40)
                    << " skip=" << d["skip"] << ": fsdpp \"" << got << "\", python " << d["text"];
    }
  }
  // The chunks overlap (every line, then multi-line blocks, then 64 KB pieces), so their bytes
  // add up to more than the corpus.
  std::cout << "[ " << name << " ] ids agree on " << agree << "/" << c.chunks.size() << " chunks (" << bytes
            << " bytes; corpus " << c.bytes.size() << " bytes)";
  if (ties > 0) std::cout << ", equal-score Viterbi ties segmented differently: " << ties;
  std::cout << ", decodes agree " << decodes << "/" << ref["decode"].size() << "\n";
}

}  // namespace

TEST(TokenizerReference, Gpt2ByteLevelBpe) { check_reference("gpt2_bpe"); }
TEST(TokenizerReference, Gpt2AddPrefixSpace) { check_reference("gpt2_prefix_space"); }
TEST(TokenizerReference, Llama3Style) { check_reference("llama3_bpe"); }
TEST(TokenizerReference, Qwen2StyleNfcAndAddedTokenOptions) { check_reference("qwen2_bpe"); }
TEST(TokenizerReference, SentencePieceBpeByteFallback) { check_reference("spm_bpe"); }
TEST(TokenizerReference, SentencePieceUnigram) { check_reference("spm_unigram"); }

// The file itself instead of its directory; the directory's tokenizer_config.json still counts.
TEST(TokenizerReference, FilePaths) {
  const char* dir = reference_dir();
  if (dir == nullptr) GTEST_SKIP() << "FSDPP_TOKENIZER_REF is unset";
  check_reference("llama3_bpe", (fs::path(dir) / "llama3_bpe" / "tokenizer.json").string());
  check_reference("spm_bpe", (fs::path(dir) / "spm_bpe" / "tokenizer.model").string());
}

// Merges written as "a b" strings instead of ["a", "b"] pairs give the same ids.
TEST(TokenizerReference, MergesAsStrings) {
  const char* dir = reference_dir();
  if (dir == nullptr) GTEST_SKIP() << "FSDPP_TOKENIZER_REF is unset";
  json tj = json::parse(read_file(fs::path(dir) / "gpt2_bpe" / "tokenizer.json"));
  for (json& m : tj["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const fs::path copy = fs::temp_directory_path() / ("fsdpp_tok_merges_" + std::to_string(::getpid()));
  fs::create_directories(copy);
  write_file(copy / "tokenizer.json", tj.dump());
  fs::copy_file(fs::path(dir) / "gpt2_bpe" / "tokenizer_config.json", copy / "tokenizer_config.json");
  check_reference("gpt2_bpe", copy.string());
  fs::remove_all(copy);
}

// Const methods from several threads at once give the single-threaded ids.
TEST(TokenizerReference, Threads) {
  const char* dir = reference_dir();
  if (dir == nullptr) GTEST_SKIP() << "FSDPP_TOKENIZER_REF is unset";
  const Corpus& c = corpus(dir);
  for (const char* name : {"llama3_bpe", "spm_bpe"}) {
    const auto tok = fsdpp::Tokenizer::from_pretrained((fs::path(dir) / name).string());
    std::vector<std::vector<int64_t>> want;
    for (size_t i = 0; i < 2000; ++i) want.push_back(tok.encode(c.chunks[i]));
    std::vector<int> bad(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        const fsdpp::Tokenizer copy = tok;
        for (size_t i = static_cast<size_t>(t); i < 2000; i += 2) bad[t] += copy.encode(c.chunks[i]) != want[i];
      });
    }
    for (auto& th : threads) th.join();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(bad[t], 0) << name << " thread " << t;
  }
}

// ---- Unit tests without Python ----

namespace {

// A byte-level tokenizer whose ids are the bytes themselves: no merges, id b for byte b.
json byte_tokenizer_json() {
  json vocab = json::object();
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : 256 + next++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = b;
  }
  return json{{"version", "1.0"},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}}},
              {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
}

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("fsdpp_tok_unit_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string write(const json& j) const {
    write_file(path / "tokenizer.json", j.dump());
    return path.string();
  }
};

std::string utf8(const std::vector<char32_t>& cps) {
  std::string s;
  for (char32_t cp : cps) {
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

}  // namespace

// encode() sees invalid UTF-8 as Python's bytes.decode("utf-8", errors="replace") does; the
// expected code points are Python 3's.
TEST(TokenizerUnit, InvalidUtf8BecomesReplacementCharacters) {
  TempDir dir;
  const auto tok = fsdpp::Tokenizer::from_pretrained(dir.write(byte_tokenizer_json()));
  const std::vector<std::pair<std::string, std::vector<char32_t>>> cases = {
      {"a\x80" "b", {0x61, 0xFFFD, 0x62}},
      {"\xC3", {0xFFFD}},
      {"\xC3(", {0xFFFD, 0x28}},
      {"\xE2\x82", {0xFFFD}},
      {"\xE2\x82\xAC", {0x20AC}},
      {"\xF0\x9F\x98", {0xFFFD}},
      {"\xF0\x9F\x98\x80", {0x1F600}},
      {"\xC0\xAF", {0xFFFD, 0xFFFD}},
      {"\xE0\x80\xAF", {0xFFFD, 0xFFFD, 0xFFFD}},
      {"\xED\xA0\x80", {0xFFFD, 0xFFFD, 0xFFFD}},
      {"\xED\x9F\xBF", {0xD7FF}},
      {"\xF4\x90\x80\x80", {0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}},
      {"\xF4\x8F\xBF\xBF", {0x10FFFF}},
      {"\xFF\xFE", {0xFFFD, 0xFFFD}},
      {"\xF8\x88\x80\x80\x80", {0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}},
      {"\xE1\x80x", {0xFFFD, 0x78}},
      {"\xF1\x80\x80", {0xFFFD}},
      {"\xC1\xBF", {0xFFFD, 0xFFFD}},
  };
  for (const auto& [raw, cps] : cases) {
    const std::string want = utf8(cps);
    const std::vector<int64_t> ids = tok.encode(raw);
    std::string got;
    for (int64_t id : ids) got += static_cast<char>(id);  // id b is byte b
    EXPECT_EQ(got, want) << "input of " << raw.size() << " bytes";
    EXPECT_EQ(tok.decode(ids), want);
  }
  // Byte-level ids that are not UTF-8 decode as the ByteLevel decoder's lossy conversion.
  EXPECT_EQ(tok.decode({0xE2, 0x82}), utf8({0xFFFD}));
  EXPECT_EQ(tok.decode({'a', 0xFF, 0xC3}), utf8({'a', 0xFFFD, 0xFFFD}));
  EXPECT_EQ(tok.decode({0xE2, 0x82, 0xAC}), utf8({0x20AC}));
}

TEST(TokenizerUnit, ErrorsNameFileAndField) {
  TempDir dir;
  const std::string file = (dir.path / "tokenizer.json").string();

  write_file(dir.path / "tokenizer.json", "{ \"model\": ");
  std::string e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.path.string()); });
  EXPECT_NE(e.find(file), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;

  json j = byte_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find(file), std::string::npos) << e;
  EXPECT_NE(e.find("pre_tokenizer.type"), std::string::npos) << e;
  EXPECT_NE(e.find("Whitespace"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Removed"}}}}};
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("pre_tokenizer.pretokenizers[0].behavior"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["normalizer"] = {{"type", "NFKC"}};
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("normalizer.type"), std::string::npos) << e;
  EXPECT_NE(e.find("NFKC"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["model"]["type"] = "WordPiece";
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("model.type"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["model"].erase("vocab");
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("model.vocab"), std::string::npos) << e;
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["model"]["merges"] = json::array({json::array({"a", "zz"})});
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("model.merges[0]"), std::string::npos) << e;

  j = byte_tokenizer_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("pre_tokenizer.pattern.Regex"), std::string::npos) << e;

  j = byte_tokenizer_json();
  write_file(dir.path / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.write(j)); });
  EXPECT_NE(e.find("tokenizer_config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("bos_token"), std::string::npos) << e;
  fs::remove(dir.path / "tokenizer_config.json");

  const auto tok = fsdpp::Tokenizer::from_pretrained(dir.write(byte_tokenizer_json()));
  e = error_of([&] { tok.decode({1, 256}); });
  EXPECT_NE(e.find("ids[1] = 256"), std::string::npos) << e;
  EXPECT_NE(e.find(file), std::string::npos) << e;
  EXPECT_THROW(tok.id_to_token(-1), std::runtime_error);

  e = error_of([&] { fsdpp::Tokenizer::from_pretrained((dir.path / "nothing_here").string()); });
  EXPECT_NE(e.find("nothing_here"), std::string::npos) << e;
  fs::remove(dir.path / "tokenizer.json");
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.path.string()); });
  EXPECT_NE(e.find("neither tokenizer.json nor tokenizer.model"), std::string::npos) << e;
  write_file(dir.path / "tokenizer.model", "not a model");
  e = error_of([&] { fsdpp::Tokenizer::from_pretrained(dir.path.string()); });
  EXPECT_NE(e.find("tokenizer.model"), std::string::npos) << e;
}

// A merge, an added token matched before pre-tokenization, BOS from the config.
TEST(TokenizerUnit, MergesAddedTokensAndConfigBos) {
  TempDir dir;
  json j = byte_tokenizer_json();
  j["model"]["vocab"]["ab"] = 256;
  j["model"]["vocab"]["abc"] = 257;
  j["model"]["merges"] = json::array({"a b", json::array({"ab", "c"})});
  j["added_tokens"] = json::array({{{"id", 258}, {"content", "<s>"}, {"special", true}, {"normalized", false}}});
  write_file(dir.path / "tokenizer_config.json", R"({"bos_token": {"content": "<s>"}, "add_bos_token": true})");
  const auto tok = fsdpp::Tokenizer::from_pretrained(dir.write(j));
  EXPECT_EQ(tok.vocab_size(), 259);
  EXPECT_EQ(tok.bos_token_id(), 258);
  EXPECT_EQ(tok.encode("abcab<s>x"), (std::vector<int64_t>{258, 257, 256, 258, 'x'}));
  EXPECT_EQ(tok.encode("abcab<s>x", false), (std::vector<int64_t>{257, 256, 258, 'x'}));
  EXPECT_EQ(tok.decode({258, 257, 256, 258, 'x'}), "<s>abcab<s>x");
  EXPECT_EQ(tok.decode({258, 257, 256, 258, 'x'}, true), "abcabx");
  EXPECT_EQ(tok.token_to_id("abc"), 257);
  EXPECT_EQ(tok.token_to_id("zzz"), std::nullopt);
  EXPECT_EQ(tok.encode(""), (std::vector<int64_t>{258}));
}

// ignore_merges (Llama 3): a pre-token that is in the vocabulary is one token, even where the
// merges cannot build it. (The trained reference tokenizers cannot show this: their merges
// always rebuild their vocabulary.)
TEST(TokenizerUnit, IgnoreMerges) {
  TempDir dir;
  json j = byte_tokenizer_json();
  j["model"]["vocab"]["ab"] = 256;
  j["model"]["vocab"]["abc"] = 257;  // no merge makes it
  j["model"]["merges"] = json::array({"a b"});
  EXPECT_EQ(fsdpp::Tokenizer::from_pretrained(dir.write(j)).encode("abc x"),
            (std::vector<int64_t>{256, 'c', ' ', 'x'}));  // id b is byte b
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(fsdpp::Tokenizer::from_pretrained(dir.write(j)).encode("abc x"),
            (std::vector<int64_t>{257, ' ', 'x'}));
}

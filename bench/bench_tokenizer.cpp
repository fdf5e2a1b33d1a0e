// Tokens per second of fsdpp::Tokenizer::encode, one thread (bench/bench_tokenizer.py is the
// same with Python's tokenizers / sentencepiece, on the same text, the same two ways).
//
//   bench_tokenizer TOKENIZER_DIR TEXT_FILE [REPEATS=3]
//
// "whole": one encode() of the whole file; "lines": one encode() per line (the line with its
// '\n'). No special tokens added. The file is taken as bytes: invalid UTF-8 is replaced by
// U+FFFD inside encode (the Python side decodes with errors="replace"). Each mode runs REPEATS
// times; the best time is printed (the first run also fills the BPE word cache, as in Python).
#include <fsdpp/tokenizer.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [REPEATS=3]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", argv[2]);
    return 2;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    end = end == std::string::npos ? text.size() : end + 1;
    lines.push_back(std::string_view(text).substr(start, end - start));
    start = end;
  }

  const auto load_start = std::chrono::steady_clock::now();
  const auto tok = fsdpp::Tokenizer::from_pretrained(argv[1]);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  std::printf("fsdpp %s: %zu bytes, %zu lines, load %.3f s\n", argv[1], text.size(), lines.size(), load_s);

  for (const char* mode : {"whole", "lines"}) {
    double best = 1e30;
    size_t tokens = 0;
    for (int r = 0; r < repeats; ++r) {
      const auto start = std::chrono::steady_clock::now();
      tokens = 0;
      if (std::string(mode) == "whole") {
        tokens = tok.encode(text, false).size();
      } else {
        for (std::string_view line : lines) tokens += tok.encode(line, false).size();
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("  %-5s tokens %zu  seconds %.4f  tokens/s %.0f  MB/s %.2f\n", mode, tokens, best, tokens / best,
                text.size() / best / 1e6);
  }
  return 0;
}

#!/usr/bin/env python3
"""Tokens per second of Python's tokenizers / sentencepiece, one thread; the counterpart of
bench/bench_tokenizer.cpp, on the same text, the same two ways.

  bench_tokenizer.py TOKENIZER_DIR TEXT_FILE [REPEATS=3]

"whole": one encode() call on the whole file; "lines": one encode() call per line (the line with
its "\\n"; no encode_batch). No special tokens added. The file is read as bytes and decoded with
errors="replace", as fsdpp does inside encode. Best of REPEATS runs.
"""
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: bench_tokenizer.py TOKENIZER_DIR TEXT_FILE [REPEATS=3]")
    path, repeats = sys.argv[1], int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with open(sys.argv[2], "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    lines, start = [], 0
    while start < len(text):  # split on "\n" only, keeping it (str.splitlines splits on more)
        end = text.find("\n", start)
        end = len(text) if end < 0 else end + 1
        lines.append(text[start:end])
        start = end

    t0 = time.perf_counter()
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        encode = lambda s: tok.encode(s, add_special_tokens=False).ids
        lib = "tokenizers"
    else:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(path, "tokenizer.model"))
        encode = sp.encode
        lib = "sentencepiece"
    print(f"python {lib} {path}: {len(raw)} bytes, {len(lines)} lines, load {time.perf_counter() - t0:.3f} s")

    for mode in ("whole", "lines"):
        best, tokens = float("inf"), 0
        for _ in range(repeats):
            t = time.perf_counter()
            if mode == "whole":
                tokens = len(encode(text))
            else:
                tokens = sum(len(encode(line)) for line in lines)
            best = min(best, time.perf_counter() - t)
        print(f"  {mode:<5} tokens {tokens}  seconds {best:.4f}  tokens/s {tokens / best:.0f}  MB/s {len(raw) / best / 1e6:.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reference data for tests/tokenizer/test_tokenizer.cpp.

Usage: tokenizer_reference.py OUTDIR

Builds a deterministic corpus (>= 1.2 MB: English prose, many scripts, emoji, numbers,
contractions, whitespace runs, special-token strings, and one part with invalid UTF-8), trains
small tokenizers on it with `tokenizers` and `sentencepiece`, and writes, per tokenizer, the ids
Python gives for every chunk of the corpus, and the text Python decodes from some id lists.

OUTDIR/
  corpus.bin              the raw corpus (bytes; one part is not valid UTF-8)
  chunks.json             {"offsets": [...], "lengths": [...]}: the chunks, as byte ranges
  <name>/                 tokenizer directory (tokenizer.json or tokenizer.model,
                          tokenizer_config.json)
  <name>.ref.json         {"name", "kind", "vocab_size", "bos", "eos", "pad",
                           "ids": [[...] per chunk], "ids_plain": [[...]] (no special tokens),
                           "decode": [{"ids", "skip", "text"}], "tokens": {token: id},
                           "scores": [...] (SentencePiece unigram only: the pieces' scores)}
  manifest.json           the list of names

Python gets str, never bytes: a chunk is given as raw.decode("utf-8", errors="replace"),
which is what fsdpp's encode does to invalid UTF-8 (see include/fsdpp/tokenizer.h).
"""
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

SEED = 20240611
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["[[note]]", "<tool>", "~fsdpp~"]

PHRASES = {
    "zh": ["我们今天在北京讨论分布式训练的问题。", "模型的参数被切分到每一个进程上。", "这是一个测试句子，包含标点符号！",
           "机器学习需要大量的数据和计算资源。", "你好，世界。天气很好，我们去公园吧？"],
    "ja": ["今日は東京で会議があります。", "カタカナとひらがなと漢字を混ぜて書きます。", "トークナイザーのテストです！",
           "すもももももももものうち。", "ｱｲｳｴｵ（半角カナ）も少し。"],
    "ko": ["안녕하세요, 반갑습니다.", "분산 학습은 여러 장치를 사용합니다.", "한국어 문장을 토큰으로 나눕니다!",
           "오늘 날씨가 정말 좋네요."],
    "ar": ["مرحبا بالعالم، هذا اختبار.", "التعلم الآلي يحتاج إلى بيانات كثيرة.", "اللُّغَةُ العَرَبِيَّةُ جَمِيلَةٌ ١٢٣٤٥٦٧."],
    "he": ["שלום עולם, זה מבחן.", "הַמּוֹדֶל מְחוּלָּק בֵּין הַתַּהֲלִיכִים.", "עברית נכתבת מימין לשמאל."],
    "hi": ["नमस्ते दुनिया, यह एक परीक्षण है।", "क्षत्रिय, द्वार, श्रृंखला, ज्ञान और हिन्दी।", "मॉडल के पैरामीटर बाँटे जाते हैं। १२३४"],
    "ru": ["Привет, мир! Это проверка.", "Модель разбита между процессами.", "Съешь же ещё этих мягких французских булок, да выпей чаю.",
           "ВЕРХНИЙ РЕГИСТР и нижний регистр."],
    "el": ["Γειά σου κόσμε! Αυτό είναι ένα τεστ.", "Η γλώσσα είναι όμορφη· ΑΛΦΑ ΒΗΤΑ ΓΑΜΜΑ.", "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία."],
    "th": ["สวัสดีชาวโลก นี่คือการทดสอบ", "ภาษาไทยไม่มีช่องว่างระหว่างคำ", "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า"],
    "misc": ["naïve café résumé coöperate Ångström", "Straße ß ẞ ǅ ǈ ﬁ ﬂ ＡＢＣ１２３", "e\u0301 a\u0308 o\u0302 n\u0303 (decomposed)",
             "math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ ≤ ∞ ≈ π", "Tiếng Việt có dấu: Nguyễn, Trần, Lê.",
             "\u00a0no-break\u00a0spaces\u2009thin\u3000ideographic\u200bzero-width"],
}
EMOJI = ["😀", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "🇺🇸", "❤️", "🤷🏿‍♀️", "🧑🏻‍🔬", "✨", "🔥🔥🔥",
         "👋🏼", "🫠", "1️⃣", "©️", "🐍"]
CONTRACTIONS = ["it's", "IT'S", "It'S", "we'll", "WE'LL", "We'Ll", "they're", "THEY'RE", "I'm", "I'M",
                "you've", "YOU'VE", "he'd", "HE'D", "don't", "DON'T", "Don'T", "'s", "'S", "o'clock",
                "rock'n'roll", "’s curly", "`quoted'"]
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which "
         "but have an they you were her she there been one all we their has would when if so no will can "
         "model shard gradient tensor parameter rank process group optimizer training step loss").split()


def english_text(rng, target):
    """Fortune-file prose where available, else generated sentences."""
    parts, size = [], 0
    root = "/usr/share/games/fortunes"
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if "." in name or not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
            parts.append(text)
            size += len(text.encode())
            if size >= target:
                break
    while size < target:
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 20))]
        line = " ".join(words).capitalize() + rng.choice([".", "!", "?", ",", ";"]) + "\n"
        parts.append(line)
        size += len(line)
    return "".join(parts)


def number(rng):
    digits = rng.randint(1, 14)
    s = str(rng.randint(0, 10 ** digits))
    return rng.choice([s, s, "-" + s, s + ".5", "0" * rng.randint(1, 3) + s, s + "%", "$" + s])


def mixed_line(rng):
    items = []
    for _ in range(rng.randint(3, 12)):
        r = rng.random()
        if r < 0.35:
            items.append(rng.choice(PHRASES[rng.choice(sorted(PHRASES))]))
        elif r < 0.45:
            items.append(rng.choice(EMOJI) * rng.randint(1, 3))
        elif r < 0.58:
            items.append(number(rng))
        elif r < 0.70:
            items.append(rng.choice(CONTRACTIONS))
        elif r < 0.76:
            items.append(rng.choice(SPECIALS + ADDED))
        elif r < 0.82:
            items.append(rng.choice(["  ", "   ", "\t", "\t\t", " \t ", "\u3000"]))
        else:
            items.append(rng.choice(WORDS).upper() if rng.random() < 0.2 else rng.choice(WORDS))
    sep = rng.choice([" ", " ", " ", "", "  "])
    line = sep.join(items)
    end = rng.choice(["\n", "\n", "\n", "\r\n", " \n", "   \n", "\n\n", "\n\n\n", "\t\n"])
    return line + end


def special_line(rng):
    tok = rng.choice(SPECIALS + ADDED)
    forms = [f"{tok}", f" {tok} ", f"x{tok}y", f"{tok}{tok}", f"hello {tok}world", f"{tok}\n{tok}",
             f"  {tok}  text", f"word{tok[:-1]}", f"{tok[1:]}", f"<|{tok}|>", f"{tok} 123 {tok}"]
    return rng.choice(forms) + "\n"


INVALID = [b"\x80", b"\xbf", b"\x80\x80", b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc0\xaf",
           b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xff", b"\xfe",
           b"\xf5\x80\x80\x80", b"\xf4\x90\x80\x80", b"\xc2", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80",
           b"\xc1\xbf", b"\xe1\x80", b"\xef\xbf"]


def invalid_part(rng, lines):
    out = []
    for line in lines:
        raw = line.encode()
        for _ in range(rng.randint(1, 4)):
            pos = rng.randint(0, len(raw))
            raw = raw[:pos] + rng.choice(INVALID) + raw[pos:]
        out.append(raw)
    return b"".join(out)


def make_corpus(rng):
    english = english_text(rng, 760_000)
    lines = english.splitlines(keepends=True)
    mixed, size = [], 0
    while size < 420_000:
        line = mixed_line(rng) if rng.random() < 0.9 else special_line(rng)
        mixed.append(line)
        size += len(line.encode())
    # Interleave prose and mixed lines in blocks so both kinds meet in the long chunks.
    out, i, j = [], 0, 0
    while i < len(lines) or j < len(mixed):
        k = rng.randint(5, 40)
        out.extend(lines[i:i + k]); i += k
        k = rng.randint(3, 25)
        out.extend(mixed[j:j + k]); j += k
    valid = "".join(out).encode()
    bad = invalid_part(rng, [mixed_line(rng) for _ in range(600)] + lines[:300])
    return valid + bad


def make_chunks(corpus, rng):
    """Every line (with its line end), then multi-line blocks, then a few 64 KB-ish chunks."""
    chunks, start = [], 0
    while start < len(corpus):
        end = corpus.find(b"\n", start)
        end = len(corpus) if end < 0 else end + 1
        chunks.append((start, end - start))
        start = end
    lines = list(chunks)
    i = 0
    while i < len(lines):
        k = rng.randint(2, 60)
        block = lines[i:i + k]
        chunks.append((block[0][0], block[-1][0] + block[-1][1] - block[0][0]))
        i += k
    for start in range(0, len(corpus), 200_000):
        chunks.append((start, min(65_536, len(corpus) - start)))  # may cut a character: fine
    return chunks


def train_hf(name, texts, outdir, kind):
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        specials = ["<|endoftext|>"]
        config = {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
                  "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer",
                  "clean_up_tokenization_spaces": False}
    else:
        tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
        pattern = LLAMA3_PATTERN if kind == "llama3" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        if kind == "qwen2":
            tok.normalizer = normalizers.NFC()
            specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            config = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                      "add_bos_token": False, "clean_up_tokenization_spaces": False,
                      "tokenizer_class": "Qwen2Tokenizer"}
        else:
            specials = ["<|begin_of_text|>", "<|end_of_text|>"]
            config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                      "clean_up_tokenization_spaces": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    if kind == "llama3":
        bot = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bot)])
        tok.add_tokens([AddedToken("[[note]]", special=False)])
    elif kind == "qwen2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
        # The options fsdpp supports on added tokens, one of each.
        tok.add_tokens([AddedToken("<tool>", special=False, lstrip=True, rstrip=True, normalized=False),
                        AddedToken("~fsdpp~", special=False, single_word=True, normalized=True)])
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    with open(path) as f:
        data = json.load(f)
    if kind == "llama3":
        data["model"]["ignore_merges"] = True
    with open(path, "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    tok = Tokenizer.from_file(path)
    lookup = lambda t: None if t is None else tok.token_to_id(t)
    return tok, lookup(config.get("bos_token")), lookup(config.get("eos_token")), lookup(config.get("pad_token"))


def with_prefix_space(outdir, source, name):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(outdir, source, "tokenizer.json")) as f:
        data = json.load(f)
    data["pre_tokenizer"]["add_prefix_space"] = True
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
    with open(os.path.join(outdir, source, "tokenizer_config.json")) as f, \
            open(os.path.join(d, "tokenizer_config.json"), "w") as g:
        g.write(f.read())
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    return tok, eot, eot, None


def train_spm(name, texts, outdir, model_type, byte_fallback):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    train_file = os.path.join(outdir, "spm_train.txt")
    with open(train_file, "w") as f:
        f.write("".join(texts))
    args = dict(input=train_file, model_prefix=os.path.join(d, "tokenizer"), vocab_size=2000,
                model_type=model_type, byte_fallback=byte_fallback, num_threads=2,
                character_coverage=0.9995, input_sentence_size=200_000, shuffle_input_sentence=False,
                bos_id=1, eos_id=2, unk_id=0, pad_id=-1 if byte_fallback else 3, minloglevel=2)
    if byte_fallback:  # as Llama 2's tokenizer.model
        args.update(normalization_rule_name="identity", split_digits=True,
                    allow_whitespace_only_pieces=True, remove_extra_whitespaces=False)
    spm.SentencePieceTrainer.train(**args)
    os.remove(train_file)
    os.remove(os.path.join(d, "tokenizer.vocab"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer"}, f, indent=1)
    return spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tokenizer_reference.py OUTDIR")
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    rng = random.Random(SEED)
    corpus = make_corpus(rng)
    assert len(corpus) >= 1_200_000, len(corpus)
    chunks = make_chunks(corpus, rng)
    with open(os.path.join(outdir, "corpus.bin"), "wb") as f:
        f.write(corpus)
    with open(os.path.join(outdir, "chunks.json"), "w") as f:
        json.dump({"offsets": [c[0] for c in chunks], "lengths": [c[1] for c in chunks]}, f)
    texts = [corpus[o:o + n].decode("utf-8", errors="replace") for o, n in chunks]
    train_texts = [t for t in texts if t.endswith("\n")][:40_000]

    names = []
    for name, kind in [("gpt2_bpe", "gpt2"), ("gpt2_prefix_space", "gpt2_prefix_space"),
                       ("llama3_bpe", "llama3"), ("qwen2_bpe", "qwen2")]:
        if kind == "gpt2_prefix_space":  # the GPT-2 tokenizer with ByteLevel add_prefix_space true
            tok, bos, eos, pad = with_prefix_space(outdir, "gpt2_bpe", name)
        else:
            tok, bos, eos, pad = train_hf(name, train_texts, outdir, kind)
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=True)]
        plain = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        vocab = tok.get_vocab_size(with_added_tokens=True)
        ref = dict(name=name, kind="hf", vocab_size=vocab, bos=bos, eos=eos, pad=pad, ids=ids,
                   ids_plain=plain, tokens={t: tok.token_to_id(t) for t in SPECIALS + ADDED
                                            if tok.token_to_id(t) is not None})
        decode = lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)
        write_ref(outdir, ref, rng, decode, vocab, ids)
        names.append(name)

    for name, model_type, fallback in [("spm_bpe", "bpe", True), ("spm_unigram", "unigram", False)]:
        sp = train_spm(name, train_texts, outdir, model_type, fallback)
        bos, eos = sp.bos_id(), sp.eos_id()
        plain = sp.encode(texts)
        ids = [[bos] + x for x in plain]
        pad = sp.pad_id() if sp.pad_id() >= 0 else None
        specials = {i for i in (bos, eos, sp.pad_id(), sp.unk_id()) if i >= 0}
        decode = lambda ids, skip: sp.decode([i for i in ids if not (skip and i in specials)])
        ref = dict(name=name, kind="spm", vocab_size=sp.get_piece_size(), bos=bos, eos=eos, pad=pad,
                   ids=ids, ids_plain=plain, tokens={sp.id_to_piece(i): i for i in range(0, 300, 7)})
        if model_type == "unigram":
            # Viterbi ties (equal total score) are broken differently by sentencepiece releases
            # (Debian's C++ 0.1.97 vs this Python 0.2.x): the test accepts a different
            # segmentation of the same text with the same total score, and counts it.
            ref["scores"] = [sp.get_score(i) for i in range(sp.get_piece_size())]
        write_ref(outdir, ref, rng, decode, sp.get_piece_size(), ids)
        names.append(name)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"tokenizers": names, "corpus_bytes": len(corpus), "chunks": len(chunks)}, f)
    print(f"{outdir}: {len(corpus)} bytes, {len(chunks)} chunks, tokenizers {names}")


def write_ref(outdir, ref, rng, decode, vocab, ids):
    """Decodes of the chunks' own ids (both skip values) and of random id lists, which
    cut characters in the middle and so test the lossy UTF-8 of the decoders."""
    lists = [x for x in ids[::7]]
    lists += [[rng.randrange(vocab) for _ in range(rng.randint(1, 30))] for _ in range(400)]
    ref["decode"] = [dict(ids=x, skip=skip, text=decode(x, skip)) for x in lists for skip in (False, True)]
    with open(os.path.join(outdir, ref["name"] + ".ref.json"), "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main()

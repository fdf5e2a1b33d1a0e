#!/usr/bin/env python3
"""Trains the main job's tokenizer: a byte-level BPE (GPT-2's pre-tokenizer and byte mapping, as
Llama 3 and Qwen2 use) of VOCAB tokens on CORPUS with Hugging Face's `tokenizers`, saved as a
Hugging Face tokenizer directory OUT (tokenizer.json, tokenizer_config.json) that fsdpp's
Tokenizer and transformers' AutoTokenizer both read.
    train-tokenizer.py CORPUS OUT [VOCAB]
"""
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

corpus, out = sys.argv[1], sys.argv[2]
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train([corpus], trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>").save_pretrained(out)
print(f"train-tokenizer: {tok.get_vocab_size()} tokens, trained on {corpus}, in {out}")

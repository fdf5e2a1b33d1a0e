#!/usr/bin/env python3
"""transformers' side of the trainer's fine-tuning test (TrainGpt.GradAccumAndFineTuneFromHuggingFace).

    hf_fine_tune.py make CORPUS OUT    a byte-level BPE tokenizer trained on CORPUS with
                                       `tokenizers` and a tiny random LlamaForCausalLM over its
                                       vocabulary, saved by save_pretrained (several shard files)
                                       with the tokenizer as a Hugging Face directory OUT
    hf_fine_tune.py check INIT OUT CORPUS
                                       OUT (train_gpt's --export-hf) opens with AutoModelForCausalLM
                                       and AutoTokenizer, generates, and its loss on CORPUS's last
                                       tenth (tokenized by Python) is below INIT's
Prints one JSON line of what it measured.
"""
import json
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def make(corpus, out):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([corpus], trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=fast.eos_token_id,
                         bos_token_id=fast.bos_token_id)
    LlamaForCausalLM(config).save_pretrained(out, max_shard_size="40KB")
    print(json.dumps({"vocab": len(fast)}))


def validation_loss(model, ids):
    with torch.no_grad():
        windows = ids[: (len(ids) // 33) * 33].view(-1, 33)[:64]
        logits = model(windows[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), windows[:, 1:].reshape(-1)).item()


def check(init, out, corpus):
    tokenizer = AutoTokenizer.from_pretrained(out)
    trained = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    before = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32).eval()
    text = open(corpus, encoding="utf-8").read()
    ids = torch.tensor(tokenizer(text[len(text) * 9 // 10:])["input_ids"])
    prompt = tokenizer("The ", return_tensors="pt")
    generated = trained.generate(**prompt, max_new_tokens=12, do_sample=False)
    print(json.dumps({"loss_before": validation_loss(before, ids), "loss_after": validation_loss(trained, ids),
                      "generated": tokenizer.decode(generated[0]),
                      "changed": sum(not torch.equal(a, b) for a, b in zip(before.state_dict().values(),
                                                                          trained.state_dict().values())),
                      "tensors": len(trained.state_dict())}))


if __name__ == "__main__":
    {"make": lambda: make(*sys.argv[2:4]), "check": lambda: check(*sys.argv[2:5])}[sys.argv[1]]()

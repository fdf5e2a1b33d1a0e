#!/usr/bin/env python3
"""transformers' side of the Llama parity tests (tests/dist/test_llama_huggingface.cpp).

    llama_reference.py make OUT      tiny random LlamaForCausalLM models saved as Hugging Face
                                     directories with several shard files (OUT/<case>/hf), the
                                     input ids (OUT/inputs.safetensors), their logits
                                     (OUT/<case>/logits.safetensors), and for the "untied" case
                                     AdamW steps on OUT/batches.safetensors (OUT/untied/trained.safetensors:
                                     the final parameters, and the losses)
    llama_reference.py logits INPUTS HF_DIR OUT [HF_DIR OUT ...]
                                     transformers' logits from directories (fsdpp's exports),
                                     loaded in float32
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

CASES = {
    # GQA (4 query heads over 2 key/value heads), untied, a vocabulary no world size divides, a
    # padding token (its embedding row gets no gradient in the AdamW steps).
    "untied": dict(tie_word_embeddings=False, pad_token_id=0),
    "tied": dict(tie_word_embeddings=True),
    # Llama 3.1's rope scaling, with an original context short enough that the test's positions
    # cross its low, medium and high frequency bands; and an explicit head_dim.
    "llama3": dict(tie_word_embeddings=False, head_dim=12, max_position_embeddings=64,
                   rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                   rope_theta=500000.0),
}
SEQ = 12
VOCAB = 67
LR, BETAS, EPS, WD, STEPS = 1e-2, (0.9, 0.95), 1e-8, 0.1, 3


def config(case):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                       attn_implementation="sdpa", **CASES[case])


def loss_of(logits, ids):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def make(out):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, SEQ))
    save_file({"input_ids": ids}, os.path.join(out, "inputs.safetensors"))
    batches = torch.randint(0, VOCAB, (STEPS, 4, SEQ))  # 4 sequences: 2 per rank at 2 ranks
    batches[:, :, 3] = 0  # the padding token in every sequence
    save_file({"batches": batches}, os.path.join(out, "batches.safetensors"))
    for case in CASES:
        torch.manual_seed(1)
        model = LlamaForCausalLM(config(case)).eval()
        with torch.no_grad():  # RMSNorm weights away from their initial ones, so a wrong load shows
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
        d = os.path.join(out, case)
        model.save_pretrained(os.path.join(d, "hf"), max_shard_size="20KB")
        with torch.no_grad():
            save_file({"logits": model(ids).logits.contiguous()}, os.path.join(d, "logits.safetensors"))
        if case != "untied":
            continue
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        losses = []
        for step in range(STEPS):
            opt.zero_grad()
            loss = loss_of(model(batches[step]).logits, batches[step])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        trained = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        trained["losses"] = torch.tensor(losses, dtype=torch.float64)
        save_file(trained, os.path.join(d, "trained.safetensors"))


def logits(inputs, *pairs):
    ids = load_file(inputs)["input_ids"]
    for hf_dir, out in zip(pairs[::2], pairs[1::2]):
        model = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="sdpa", dtype=torch.float32).eval()
        with torch.no_grad():
            save_file({"logits": model(ids).logits.contiguous()}, out)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    elif sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")

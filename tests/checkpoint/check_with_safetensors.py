#!/usr/bin/env python3
"""Reads an fsdpp checkpoint with Python's own `safetensors` package (Hugging Face's), as a user of
the Python ecosystem would, and compares every tensor to an expected full state dict.

  check_with_safetensors.py CHECKPOINT_DIR CONSOLIDATED.safetensors EXPECTED.json

EXPECTED.json: {key: {"shape": [...], "hex": raw float32 bytes}}. Each rank file is opened with
safetensors.torch.load_file; its chunks are placed by metadata.json's offsets and sizes. Exit 0
and "ok ..." when both the per-rank files and the consolidated file give exactly the expected
tensors; exit 1 naming the first difference.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file


def expected_tensors(path):
    with open(path) as f:
        spec = json.load(f)
    out = {}
    for key, t in spec.items():
        raw = bytearray.fromhex(t["hex"])
        out[key] = torch.frombuffer(raw, dtype=torch.float32).reshape(t["shape"]).clone()
    return out


def assembled_from_rank_files(ckpt):
    with open(os.path.join(ckpt, "metadata.json")) as f:
        meta = json.load(f)
    files = {f["name"]: load_file(os.path.join(ckpt, f["name"])) for f in meta["files"]}
    out = {}
    for key, entry in meta["entries"].items():
        if entry["type"] != "tensor":
            continue
        full = torch.full(entry["shape"], float("nan"), dtype=torch.float32)
        for chunk in entry["chunks"]:
            region = tuple(slice(o, o + s) for o, s in zip(chunk["offsets"], chunk["sizes"]))
            full[region] = files[chunk["file"]][chunk["name"]]
        out[key] = full
    return out, len(files)


def compare(what, got, expected):
    if sorted(got) != sorted(expected):
        sys.exit(f"{what}: keys {sorted(got)} differ from the expected {sorted(expected)}")
    for key, value in expected.items():
        if not torch.equal(got[key], value):
            sys.exit(f"{what}: tensor {key} differs from the model's full state dict")


def main():
    ckpt, consolidated, expected_path = sys.argv[1:4]
    expected = expected_tensors(expected_path)
    from_ranks, n_files = assembled_from_rank_files(ckpt)
    compare(f"{ckpt} (per-rank files)", from_ranks, expected)
    compare(consolidated, load_file(consolidated), expected)
    print(f"ok: {len(expected)} tensors equal from {n_files} rank files and from the consolidated file")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Reads a file of fsdpp::checkpoint::export_safetensors with Python's own `safetensors` package
(Hugging Face's), as a user of the Python ecosystem would, and compares every tensor, dtype
included, to an expected full state dict.

  check_export_with_safetensors.py EXPORTED.safetensors EXPECTED.json

EXPECTED.json: {key: {"shape": [...], "dtype": ATen's name ("Float", "BFloat16", "Long", ...),
"hex": raw bytes}}. Exit 0 and "ok ..." when the file holds exactly the expected tensors;
exit 1 naming the first difference.
"""
import json
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

DTYPES = {"Float": torch.float32, "Double": torch.float64, "Half": torch.float16, "BFloat16": torch.bfloat16,
          "Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8, "Byte": torch.uint8,
          "Bool": torch.bool}


def expected_tensors(path):
    with open(path) as f:
        spec = json.load(f)
    out = {}
    for key, t in spec.items():
        raw = bytearray.fromhex(t["hex"])
        dtype = DTYPES[t["dtype"]]
        out[key] = torch.frombuffer(raw, dtype=dtype).reshape(t["shape"]).clone() if raw else \
            torch.empty(t["shape"], dtype=dtype)
    return out


def main():
    exported, expected_path = sys.argv[1:3]
    expected = expected_tensors(expected_path)
    got = load_file(exported)
    if sorted(got) != sorted(expected):
        sys.exit(f"{exported}: keys {sorted(got)} differ from the expected {sorted(expected)}")
    for key, value in expected.items():
        if got[key].dtype != value.dtype:
            sys.exit(f"{exported}: tensor {key} is {got[key].dtype}, expected {value.dtype}")
        if not torch.equal(got[key], value):
            sys.exit(f"{exported}: tensor {key} differs from the model's full state dict")
    with safe_open(exported, framework="pt") as f:
        metadata = f.metadata()
    if metadata.get("format") != "pt" or metadata.get("step") != "1":
        sys.exit(f"{exported}: __metadata__ {metadata} lacks format=pt and step=1")
    print(f"ok: {len(expected)} tensors equal, dtypes included; __metadata__ {metadata}")


if __name__ == "__main__":
    main()

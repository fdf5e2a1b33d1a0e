#!/usr/bin/env python3
"""An independent reader/writer of fsdpp's checkpoint format using only Python's standard
library, written from docs/checkpoint-format.md and the safetensors spec.

  read FILE          print {name: {dtype, shape, hex}} of a safetensors file, checking the spec
  write FILE         write a safetensors file the way Python's safetensors / Hugging Face do
  checkpoint DIR     assemble every tensor of a checkpoint from its chunks; print
                     {"tensors": {key: {dtype, shape, hex}}, "values": {key: value}}
"""
import json
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def read_header(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            assert all(isinstance(v, str) for v in t.values()), "__metadata__ values must be strings"
            continue
        b, e = t["data_offsets"]
        assert e - b == numel(t["shape"]) * SIZES[t["dtype"]], name
        spans.append((b, e, name))
    # The spec: the byte buffer is entirely indexed, without holes or overlaps.
    spans.sort()
    pos = 0
    for b, e, name in spans:
        assert b == pos, "hole or overlap before %s" % name
        pos = e
    assert pos == len(body), "buffer has %d bytes, tensors cover %d" % (len(body), pos)
    return header, 8 + n, data


def cmd_read(path):
    header, start, data = read_header(path)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        out[name] = {"dtype": t["dtype"], "shape": t["shape"], "hex": data[start + b:start + e].hex()}
    print(json.dumps(out, sort_keys=True))


def cmd_write(path):
    # Deterministic values the C++ test recomputes.
    tensors = {
        "a.weight": ("F32", [6, 4], struct.pack("<24f", *[i * 0.5 for i in range(24)])),
        "b.bias": ("F64", [5], struct.pack("<5d", *[-float(i) for i in range(5)])),
        "c.index": ("I64", [3, 2], struct.pack("<6q", *[i * 1000 for i in range(6)])),
        "d.half": ("F16", [2, 3], struct.pack("<6e", *[i + 0.25 for i in range(6)])),
        # bfloat16: the upper half of a float32
        "e.bf16": ("BF16", [4], b"".join(struct.pack("<f", i * 2.0)[2:] for i in range(4))),
        "f.mask": ("BOOL", [4], bytes([1, 0, 0, 1])),
    }
    # As safetensors.torch.save_file: largest alignment first, then by name; header padded to 8.
    order = sorted(tensors, key=lambda k: (-SIZES[tensors[k][0]], k))
    header = {"__metadata__": {"format": "pt"}}
    offset = 0
    for k in order:
        dtype, shape, raw = tensors[k]
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for k in order:
            f.write(tensors[k][2])


def cmd_checkpoint(d):
    with open(d + "/metadata.json") as f:
        meta = json.load(f)
    assert meta["format"] == "fsdpp-checkpoint" and meta["version"] == 1
    headers = {}
    for fi in meta["files"]:
        header, start, data = read_header(d + "/" + fi["name"])
        assert len(data) == fi["size"], fi["name"]
        headers[fi["name"]] = (header, start, data)
    tensors, values = {}, {}
    for key, e in meta["entries"].items():
        if e["type"] != "tensor":
            values[key] = bytes.fromhex(e["hex"]).hex() if e["type"] == "bytes" else e["value"]
            continue
        shape, size = e["shape"], SIZES[e["dtype"]]
        full = bytearray(numel(shape) * size)
        strides = [numel(shape[i + 1:]) for i in range(len(shape))]
        filled = 0
        for c in e["chunks"]:
            header, start, data = headers[c["file"]]
            t = header[c["name"]]
            b, end = c["byte_range"]
            assert (start + t["data_offsets"][0], start + t["data_offsets"][1]) == (b, end), c["name"]
            assert t["shape"] == c["sizes"] and t["dtype"] == e["dtype"], c["name"]
            raw = data[b:end]
            sizes, offs = c["sizes"], c["offsets"]
            n = numel(sizes)
            filled += n
            # element by element, row-major: global index = sum((offset + local) * stride)
            for i in range(n):
                rem, g = i, 0
                for dim in reversed(range(len(sizes))):
                    local = rem % sizes[dim]
                    rem //= sizes[dim]
                    g += (offs[dim] + local) * strides[dim]
                full[g * size:(g + 1) * size] = raw[i * size:(i + 1) * size]
        assert filled == numel(shape), key
        tensors[key] = {"dtype": e["dtype"], "shape": shape, "hex": full.hex()}
    print(json.dumps({"tensors": tensors, "values": values}, sort_keys=True))


if __name__ == "__main__":
    {"read": cmd_read, "write": cmd_write, "checkpoint": cmd_checkpoint}[sys.argv[1]](sys.argv[2])

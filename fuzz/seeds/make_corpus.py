#!/usr/bin/env python3
"""Writes fuzz/corpus/<target>/ from the checkpoints save_seed_checkpoints wrote (real files)
plus hand-broken variants of them. Run by fuzz/seeds/make_corpus.sh.
    make_corpus.py SAVED_DIR CORPUS_DIR"""
import json
import os
import struct
import sys

SEP = b"\n=====fsdpp-fuzz-file=====\n"  # fuzz/checkpoint_fuzzer.cpp's kSeparator
saved, corpus = sys.argv[1], sys.argv[2]


def put(target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(*path):
    with open(os.path.join(saved, *path), "rb") as f:
        return f.read()


def dumps(j):
    return json.dumps(j, indent=1).encode()


checkpoints = ["rows", "grid", "dtypes"]
metas = {c: read(c, "metadata.json") for c in checkpoints}
datas = {c: read(c, "rank-00000.safetensors") for c in checkpoints}

# --- real files ---
for c in checkpoints:
    put("metadata_fuzzer", "real-%s.json" % c, metas[c])
    put("safetensors_fuzzer", "real-%s-rank-00000.safetensors" % c, datas[c])
    put("checkpoint_fuzzer", "real-%s" % c, metas[c] + SEP + datas[c])
for f in ["dtypes", "empty_first", "no_tensors"]:
    put("safetensors_fuzzer", "real-%s.safetensors" % f, read(f + ".safetensors"))


# --- hand-broken metadata.json (of "rows": w [8, 4] in chunks w@0,0 and w@4,0) ---
def rows_edit(edit):
    j = json.loads(metas["rows"])
    edit(j)
    return dumps(j)


def chunk(j, i):
    return j["entries"]["w"]["chunks"][i]


def setitem(d, k, v):
    d[k] = v


broken = {
    "truncated": metas["rows"][: len(metas["rows"]) // 2],
    "empty": b"",
    "not-an-object": b"[1, 2, 3]",
    "deep-nesting": b"[" * 20000 + b"]" * 20000,
    "deep-nesting-in-entries": b'{"format": "fsdpp-checkpoint", "version": 1, "world_size": 1, "files": [], '
    b'"entries": {"k": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000 + b"}}",
    "bad-utf8-key": metas["rows"].replace(b'"step"', b'"st\xff\xfep"'),
    "bad-utf8-escape": metas["rows"].replace(b'"gpt-tiny"', b'"\\ud800"'),
    "duplicate-keys": metas["rows"].replace(b'"entries": {', b'"entries": {\n  "step": {"type": "string", "value": "x"},', 1),
    "duplicate-file": rows_edit(lambda j: j["files"].append({"name": j["files"][0]["name"], "size": 1})),
    "huge-shape": rows_edit(lambda j: setitem(j["entries"]["w"], "shape", [2**40, 2**40])),
    "negative-shape": rows_edit(lambda j: setitem(j["entries"]["w"], "shape", [-8, -4])),
    "shape-float": rows_edit(lambda j: setitem(j["entries"]["w"], "shape", [8.0, 4.5])),
    "negative-offset": rows_edit(lambda j: setitem(chunk(j, 1), "offsets", [-4, 0])),
    "overflowing-offset": rows_edit(lambda j: setitem(chunk(j, 1), "offsets", [2**63 - 1, 0])),
    "offset-past-int64": rows_edit(lambda j: setitem(chunk(j, 1), "offsets", [2**64 + 3, 0])),
    "overlap-and-hole": rows_edit(lambda j: setitem(chunk(j, 1), "offsets", [2, 0])),
    "chunk-outside": rows_edit(lambda j: setitem(chunk(j, 1), "offsets", [6, 0])),
    "byte-range-negative": rows_edit(lambda j: setitem(chunk(j, 0), "byte_range", [-64, 0])),
    "byte-range-past-file": rows_edit(lambda j: setitem(chunk(j, 0), "byte_range", [2**62, 2**62 + 64])),
    "byte-range-three": rows_edit(lambda j: setitem(chunk(j, 0), "byte_range", [0, 64, 128])),
    "step-1e40": rows_edit(lambda j: setitem(j["entries"]["step"], "value", 1e40)),
    "step-2pow63": rows_edit(lambda j: setitem(j["entries"]["step"], "value", 2**63)),
    "step-string": rows_edit(lambda j: setitem(j["entries"]["step"], "value", "7")),
    "wrong-dtype": rows_edit(lambda j: setitem(j["entries"]["w"], "dtype", "F8_E4M3")),
    "dtype-number": rows_edit(lambda j: setitem(j["entries"]["w"], "dtype", 32)),
    "unknown-type": rows_edit(lambda j: setitem(j["entries"]["step"], "type", "int128")),
    "world-size-zero": rows_edit(lambda j: setitem(j, "world_size", 0)),
    "world-size-huge": rows_edit(lambda j: setitem(j, "world_size", 2**40)),
    "version-2": rows_edit(lambda j: setitem(j, "version", 2)),
    "file-name-traversal": rows_edit(lambda j: setitem(j["files"][0], "name", "../../etc/passwd")),
    "file-size-negative": rows_edit(lambda j: setitem(j["files"][0], "size", -1)),
    "file-size-huge": rows_edit(lambda j: [setitem(j["files"][0], "size", 2**63 - 1),
                                            j["files"].append({"name": "b", "size": 2**63 - 1})]),
    "hex-odd": rows_edit(lambda j: setitem(j["entries"]["rng"], "hex", "abc")),
    "hex-not-hex": rows_edit(lambda j: setitem(j["entries"]["rng"], "hex", "zz")),
    "double-words": rows_edit(lambda j: setitem(j["entries"]["lr"], "value", "-nan")),
    "files-not-a-list": rows_edit(lambda j: setitem(j, "files", 5)),
    "chunks-an-object": rows_edit(lambda j: setitem(j["entries"]["w"], "chunks", {"a": 1})),
    "zero-d-with-offsets": rows_edit(lambda j: setitem(j["entries"]["w"], "shape", [])),
}
for name, data in broken.items():
    put("metadata_fuzzer", "broken-%s.json" % name, data)
    put("checkpoint_fuzzer", "broken-metadata-%s" % name, data + SEP + datas["rows"])


# --- hand-broken safetensors files (of "rows"' data file) ---
def st(header, data=b"", length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if length is None else length) + h + data


rows = datas["rows"]
n = struct.unpack("<Q", rows[:8])[0]
hdr = json.loads(rows[8 : 8 + n])
body = rows[8 + n :]
first = next(k for k in hdr if k != "__metadata__")


def hdr_edit(edit):
    h = json.loads(rows[8 : 8 + n])
    edit(h)
    return st(h, body)


bad = {
    "short": rows[:7],
    "header-only": rows[: 8 + n],
    "truncated-data": rows[: len(rows) - 5],
    "length-2pow63": st(b"{}", length=2**63),
    "length-max": st(b"{}", length=2**64 - 1),
    "length-past-limit": st(b"{}", length=100 * 1000 * 1000 + 1),
    "length-past-file": st(b"{}", length=1000),
    "not-json": st(b"{not json}"),
    "not-an-object": st(b"[1]"),
    "bad-utf8": st(b'{"\xff\xfe": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}', b"\0" * 4),
    "deep-nesting": st(b"[" * 20000 + b"]" * 20000),
    "duplicate-keys": st(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                         b'"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', b"\0" * 8),
    "negative-offsets": hdr_edit(lambda h: setitem(h[first], "data_offsets", [-16, 0])),
    "overflowing-offsets": hdr_edit(lambda h: setitem(h[first], "data_offsets", [0, 2**63 - 1])),
    "offsets-float": hdr_edit(lambda h: setitem(h[first], "data_offsets", [0.0, 1e40])),
    "offsets-past-int64": hdr_edit(lambda h: setitem(h[first], "data_offsets", [2**64 - 64, 2**64 - 1])),
    "shape-float": hdr_edit(lambda h: setitem(h[first], "shape", [1e40, 1])),
    "shape-huge": hdr_edit(lambda h: setitem(h[first], "shape", [2**40, 2**40])),
    "shape-negative": hdr_edit(lambda h: setitem(h[first], "shape", [-4, -4])),
    "wrong-dtype": hdr_edit(lambda h: setitem(h[first], "dtype", "F8_E5M2")),
    "dtype-number": hdr_edit(lambda h: setitem(h[first], "dtype", 4)),
    "metadata-not-string": hdr_edit(lambda h: setitem(h, "__metadata__", {"format": 1})),
    "overlap": st({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16),
    "empty-tensor-at-next-begin": st({"z": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
                                      "b": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8),
}
for name, data in bad.items():
    put("safetensors_fuzzer", "broken-%s.safetensors" % name, data)
    put("checkpoint_fuzzer", "broken-data-%s" % name, metas["rows"] + SEP + data)

flipped = bytearray(rows)
flipped[-1] ^= 0xFF
put("checkpoint_fuzzer", "broken-data-checksum", metas["rows"] + SEP + bytes(flipped))
put("checkpoint_fuzzer", "broken-data-missing", metas["rows"])
# Two data files: "rows"' metadata naming a second file that holds "grid"'s data.
two = json.loads(metas["rows"])
two["files"].append({"name": "rank-00001.safetensors", "size": len(datas["grid"])})
put("checkpoint_fuzzer", "two-files", dumps(two) + SEP + datas["rows"] + SEP + datas["grid"])

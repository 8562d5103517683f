#!/usr/bin/env python3
"""Writes the safetensors fuzz seeds next to this file: small valid files (F32, F16, BF16, I64,
metadata, a scalar, an empty tensor) and broken ones (truncated, bad JSON, offsets out of
range, overlapping). Written here with struct/json, no bytes of a downloaded model; named .bin
so that nothing in the repo looks like a model file."""
import json
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))


def st(tensors, data, meta=None, pad=0):
    h = dict(tensors)
    if meta is not None:
        h["__metadata__"] = meta
    hdr = json.dumps(h).encode() + b" " * pad
    return struct.pack("<Q", len(hdr)) + hdr + data


f32 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
seeds = {
    "valid_f32": st({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, f32),
    "valid_mixed": st({
        "a.weight": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
        "a.bias": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]},
        "ids": {"dtype": "I64", "shape": [1, 2], "data_offsets": [16, 32]},
        "s": {"dtype": "F32", "shape": [], "data_offsets": [32, 36]},
        "e": {"dtype": "U8", "shape": [0, 5], "data_offsets": [36, 36]},
    }, bytes(range(36)), meta={"format": "pt"}, pad=5),
    "truncated": st({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, f32[:20]),
    "bad_json": struct.pack("<Q", 20) + b'{"w": {"dtype": "F3' + b"\x00" * 24,
    "out_of_range": st({"w": {"dtype": "F32", "shape": [64], "data_offsets": [0, 256]}}, f32),
    "overlap": st({"a": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]},
                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, f32),
    "empty_header": struct.pack("<Q", 2) + b"{}",
}
for name, b in seeds.items():
    with open(os.path.join(here, name + ".bin"), "wb") as f:
        f.write(b)

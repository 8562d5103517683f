#!/usr/bin/env python3
"""Seeds for tests/fuzz/fuzz_cache_verifier.c: two well-formed token blobs (8 dims) with texts,
and the shipped weights file, each behind the byte that picks the fuzzer's mode.

    python3 tests/fuzz/corpus/cache_verifier/make.py
"""
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[3]


def blob(n, seed):
    out = struct.pack("<HH", n, 8)
    out += b"".join(struct.pack("<f", 1.0 / (40 + seed + t)) for t in range(n))
    out += bytes((seed * 7 + i * 13) % 255 - 127 & 0xFF for i in range(n * 8))
    return out


a, b = blob(3, 1), blob(2, 2)
text = b"What's the tallest mountain?Which mountain is the tallest?"
(HERE / "blobs").write_bytes(b"\x00" + bytes([len(a), len(b)]) + a + b + text)
(HERE / "weights").write_bytes(b"\x01" + (ROOT / "policies" / "cache.verifier").read_bytes())

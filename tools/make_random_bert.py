#!/usr/bin/env python3
"""Write a BERT sentence encoder of a real model's shape with random weights, for speed runs
where the real weights cannot travel (scripts/gpu-check on a GPU machine).

  tools/make_random_bert.py --like DIR --out OUT_DIR [--seed N]

DIR holds the real model's small files (config.json, vocab.txt and the sentence-transformers
*.json beside them; not model.safetensors): they are copied, and OUT_DIR/model.safetensors gets
every tensor llmgw's loader reads (engine/encoder/bert.c), named as Hugging Face's BertModel
names them, f32, drawn from a normal distribution (LayerNorm weights 1, biases small). The
encoder's speed does not depend on the values; its embeddings mean nothing. numpy only.
"""
from __future__ import annotations

import argparse
import json
import shutil
import struct
import sys
from pathlib import Path

import numpy as np


def tensors(cfg: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    H, F, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]

    def w(*shape, std=0.05):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))

    t = {
        "embeddings.word_embeddings.weight": w(cfg["vocab_size"], H),
        "embeddings.position_embeddings.weight": w(cfg["max_position_embeddings"], H),
        "embeddings.token_type_embeddings.weight": w(cfg["type_vocab_size"], H),
        "embeddings.LayerNorm.weight": np.ones(H, np.float32),
        "embeddings.LayerNorm.bias": w(H, std=0.01),
    }
    for i in range(L):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            t[p + f"attention.self.{name}.weight"] = w(H, H)
            t[p + f"attention.self.{name}.bias"] = w(H, std=0.01)
        t[p + "attention.output.dense.weight"] = w(H, H)
        t[p + "attention.output.dense.bias"] = w(H, std=0.01)
        t[p + "attention.output.LayerNorm.weight"] = np.ones(H, np.float32)
        t[p + "attention.output.LayerNorm.bias"] = w(H, std=0.01)
        t[p + "intermediate.dense.weight"] = w(F, H)
        t[p + "intermediate.dense.bias"] = w(F, std=0.01)
        t[p + "output.dense.weight"] = w(H, F)
        t[p + "output.dense.bias"] = w(H, std=0.01)
        t[p + "output.LayerNorm.weight"] = np.ones(H, np.float32)
        t[p + "output.LayerNorm.bias"] = w(H, std=0.01)
    return t


def write_safetensors(path: Path, t: dict[str, np.ndarray]) -> None:
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for k, v in t.items():
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for v in t.values():
            f.write(np.ascontiguousarray(v).tobytes())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--like", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=20261205)
    a = ap.parse_args()
    if not (a.like / "config.json").is_file() or not (a.like / "vocab.txt").is_file():
        sys.exit(f"{a.like}: needs config.json and vocab.txt")
    a.out.mkdir(parents=True, exist_ok=True)
    for f in a.like.rglob("*"):
        if f.is_file() and f.name != "model.safetensors" and f.suffix in (".json", ".txt"):
            dst = a.out / f.relative_to(a.like)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dst)
    cfg = json.loads((a.like / "config.json").read_text())
    write_safetensors(a.out / "model.safetensors",
                      tensors(cfg, np.random.Generator(np.random.PCG64(a.seed))))
    print(a.out / "model.safetensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Write tiny random-weight GGUF models for llmgw's fast engine unit tests.

The models are NOT committed (each carries the full 49152-token SmolLM2 vocabulary, so the
embedding matrix alone is 49152 x 256): tests regenerate them with this tool into the build
dir. Output is deterministic: same seed + same `gguf`/`numpy` versions -> identical bytes;
tests/golden/tiny_golden.json records each file's sha256 so a test can tell drift in the
generator apart from a bug in the engine.

Every model:
  hidden 256, 2 layers, 4 heads (head_dim 64), 2 KV heads, FFN 512, context 2048,
  tokenizer = every tokenizer.* key copied verbatim from the SmolLM2 GGUF (gpt2 BPE,
  pre "smollm", 49152 tokens, ChatML template), so real text can be tokenized.
  (Hidden and FFN are multiples of 256 so that K-quants, whose blocks are 256 wide, fit every
  matrix; all types use the same shapes so they can be compared with each other.)
  All 2-D weights - token_embd, output (when untied) and every layer matrix - are stored in
  the model's weight type; norm weights and biases stay F32.

Architectures (llama.cpp picks the RoPE flavour from the architecture, not from metadata):
  llama : RoPE "normal" (adjacent pairs), base 10000, rms eps 1e-5, no biases
  qwen2 : RoPE NEOX (pairs i, i+64/2), base 1e6, rms eps 1e-6, q/k/v biases (F32)

Weight types: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q6_K.
  F16/BF16/Q8_0/Q4_0/Q4_1 are made with gguf.quants.quantize. gguf 0.19 has no quantizer for
  Q4_K/Q6_K (only dequantizers), so this file quantizes those itself with a plain
  min/max (Q4_K) / abs-max (Q6_K) rounding into the standard GGUF block layouts (Q4_K: 144
  bytes = f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles; Q6_K:
  210 bytes = 128 ql, 64 qh, 16 int8 scales, f16 d). The result is checked against
  gguf.quants.dequantize. It is not llama.cpp's (better, iterative) quantizer - it need not
  be: the test compares engines on the same stored bytes.

The float weights of an architecture are drawn once from numpy's PCG64 with a fixed seed, so
all weight types of one architecture hold the same underlying weights (cross-type sanity
checks are meaningful: logits of e.g. the Q8_0 and F32 models should be close).

Models (name -> arch, type, tied output):
  tiny-llama-<type>          llama, tied   (like SmolLM2: no output.weight, uses token_embd)
  tiny-qwen2-<type>          qwen2, untied (has output.weight)
  tiny-llama-q8_0-untied     llama, untied
  tiny-qwen2-q8_0-tied       qwen2, tied
  tiny-llama3-f32            llama, tied, F32, like Llama-3.1/3.2: RoPE base 500000 and a
                             rope_freqs.weight tensor (F32 [head_dim/2] per-frequency divisors
                             of the angle) made with llama3 rope scaling's formula - factor 8,
                             low/high frequency factors 1 and 4 - for an original context of 256
                             (scaled down so that the divisors reach the pairs whose angles
                             matter at the prompt's positions): 1 for the high frequencies, a
                             smooth ramp, 8 for the low ones. Same weights as tiny-llama-f32.

--shape smollm2-1.7b writes the same models (same names with "tiny" replaced by the shape's
name) at SmolLM2-1.7B's shape instead: hidden 2048, 24 layers, 32 heads, 32 KV heads, FFN 8192
(random weights, for speed measurements only: bench/speculative's cost model). The F16 file is
3.4 GB and drawing it takes ~10 GB of memory. --shape llama3-8b (hidden 4096, 32 layers, 32
heads, 8 KV heads, FFN 14336, context 8192, the 49152-token SmolLM2 vocabulary) writes its
Q4_K, Q4_0 or Q8_0 models as random blocks directly (no float draw; ~4.5 GB for Q4_K): for
scripts/gpu-check's speed runs only; --shape smollm2-135m likewise at SmolLM2-135M's shape
(hidden 576, 30 layers, 9 heads, 3 KV heads, FFN 1536: the real file's speed in any of those
types, Q4_1 included, without the real file).

Usage:
  tools/make_tiny_gguf.py --out DIR [--only NAME ...] [--vocab-from GGUF] [--seed N]
                          [--shape tiny|smollm2-1.7b|llama3-8b|smollm2-135m]
  tools/make_tiny_gguf.py --list
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf import GGUFValueType as VT
except ImportError:  # pragma: no cover
    sys.exit("make_tiny_gguf.py needs the `gguf` package (pip install gguf==0.19.0)")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VOCAB = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SEED = 20251202

SHAPES = {  # name -> (hidden, layers, heads, KV heads, FFN, context)
    "tiny": (256, 2, 4, 2, 512, 2048),
    "smollm2-1.7b": (2048, 24, 32, 32, 8192, 2048),
    "llama3-8b": (4096, 32, 32, 8, 14336, 8192),
    "smollm2-135m": (576, 30, 9, 3, 1536, 8192),
}
# Shapes too large to draw as floats and quantize here: their quantized matrices are random
# blocks written directly (random quants, fixed small scales; bench only), norms are ones.
RAW_SHAPES = {"llama3-8b", "smollm2-135m"}
RAW = False
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = SHAPES["tiny"]
HEAD_DIM = N_EMBD // N_HEAD


def set_shape(name: str) -> None:
    global N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX, HEAD_DIM, RAW
    N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, N_FF, N_CTX = SHAPES[name]
    HEAD_DIM = N_EMBD // N_HEAD
    RAW = name in RAW_SHAPES


RAW_BLOCK = {"Q4_K": (256, 144), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34)}


def raw_blocks(shape: tuple[int, int], t: str, rng: np.random.Generator) -> np.ndarray:
    """Random blocks of quantized type t for a (n_out, n_in) matrix, as GGUFWriter takes them:
    uint8 [n_out][bytes of a row]. The f16 scale fields (and Q4_K's min) are set to small
    values so that activations stay finite; the quants are random."""
    elems, size = RAW_BLOCK[t]
    n_out, n_in = shape
    nb = n_out * n_in // elems
    b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    d = np.frombuffer(np.float16(0.5 / np.sqrt(n_in)).tobytes(), dtype=np.uint8)
    b[:, 0:2] = d
    if t in ("Q4_K", "Q4_1"):   # the min (Q4_K: dmin), below zero for Q4_1's centring
        m = 0.25 / np.sqrt(n_in) if t == "Q4_K" else -4.0 * 0.5 / np.sqrt(n_in)
        b[:, 2:4] = np.frombuffer(np.float16(m).tobytes(), dtype=np.uint8)
    return b.reshape(n_out, n_in // elems * size)

ARCH = {
    "llama": dict(rope_base=10000.0, eps=1e-5, qkv_bias=False, arch_index=0),
    "qwen2": dict(rope_base=1000000.0, eps=1e-6, qkv_bias=True, arch_index=1),
}
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
FILE_TYPE = {  # general.file_type (llama_ftype)
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K": 15, "Q6_K": 18, "BF16": 32,
}


def model_list() -> list[dict]:
    out = []
    for arch, tied in (("llama", True), ("qwen2", False)):
        for t in TYPES:
            out.append(dict(name=f"tiny-{arch}-{t.lower()}", arch=arch, type=t, tied=tied))
    out.append(dict(name="tiny-llama-q8_0-untied", arch="llama", type="Q8_0", tied=False))
    out.append(dict(name="tiny-qwen2-q8_0-tied", arch="qwen2", type="Q8_0", tied=True))
    out.append(dict(name="tiny-llama3-f32", arch="llama", type="F32", tied=True,
                    rope_base=500000.0, rope_freqs=True))
    return out


LLAMA3_FACTOR, LLAMA3_LOW_FREQ_FACTOR, LLAMA3_HIGH_FREQ_FACTOR = 8.0, 1.0, 4.0
LLAMA3_ORIG_CTX = 256   # Llama-3.1's is 8192; scaled down to the tiny model's positions


def llama3_rope_freqs(base: float) -> np.ndarray:
    """llama3 rope scaling as per-pair divisors (what Llama-3.1 GGUFs store as rope_freqs):
    1 where the wavelength is below orig_ctx / high_freq_factor, `factor` above
    orig_ctx / low_freq_factor, and in between 1 / ((1 - s) / factor + s) with s the position
    of orig_ctx / wavelength between low_freq_factor and high_freq_factor."""
    inv = base ** -(np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)
    wavelen = 2.0 * np.pi / inv
    low_wl = LLAMA3_ORIG_CTX / LLAMA3_LOW_FREQ_FACTOR
    high_wl = LLAMA3_ORIG_CTX / LLAMA3_HIGH_FREQ_FACTOR
    out = np.ones(HEAD_DIM // 2, dtype=np.float64)
    for i, wl in enumerate(wavelen):
        if wl > low_wl:
            out[i] = LLAMA3_FACTOR
        elif wl >= high_wl:
            s = (LLAMA3_ORIG_CTX / wl - LLAMA3_LOW_FREQ_FACTOR) / (
                LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR)
            out[i] = 1.0 / ((1.0 - s) / LLAMA3_FACTOR + s)
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# K-quant writers (GGUF block layouts; QK_K = 256)

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """rows: float32 (n, k), k % 256 == 0 -> uint8 (n, k/256*144)."""
    n, k = rows.shape
    x = rows.reshape(-1, 8, 32).astype(np.float32)               # (nb, 8 sub-blocks, 32)
    nb = x.shape[0]
    mn = np.minimum(x.min(axis=-1), 0.0)                          # (nb, 8) <= 0
    mx = x.max(axis=-1)
    scale = (mx - mn) / 15.0                                      # >= 0
    mins = -mn                                                    # >= 0
    d = _f16(scale.max(axis=-1) / 63.0)                           # (nb,)
    dmin = _f16(mins.max(axis=-1) / 63.0)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.round(scale / df[:, None]), 0)
        m = np.where(dminf[:, None] > 0, np.round(mins / dminf[:, None]), 0)
    sc = np.clip(sc, 0, 63).astype(np.uint8)
    m = np.clip(m, 0, 63).astype(np.uint8)
    eff_d = df[:, None] * sc.astype(np.float32)                    # (nb, 8)
    eff_m = dminf[:, None] * m.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(eff_d[..., None] > 0, np.round((x + eff_m[..., None]) / eff_d[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)                        # (nb, 8, 32)
    # scales: bytes 0-3 = sc[0..3] | (sc[4..7]>>4)<<6 ; bytes 4-7 = m[0..3] | (m[4..7]>>4)<<6 ;
    # bytes 8-11 = (sc[4..7]&15) | (m[4..7]&15)<<4
    scales = np.empty((nb, 12), dtype=np.uint8)
    scales[:, 0:4] = (sc[:, 0:4] & 0x3F) | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = (m[:, 0:4] & 0x3F) | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    # qs: 4 groups of 32 bytes; group g low nibble = sub-block 2g, high nibble = sub-block 2g+1
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(nb, 128)
    blocks = np.concatenate([d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2),
                             scales, qs], axis=1)
    return blocks.reshape(n, (k // QK_K) * 144)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """rows: float32 (n, k), k % 256 == 0 -> uint8 (n, k/256*210)."""
    n, k = rows.shape
    x = rows.reshape(-1, 16, 16).astype(np.float32)              # (nb, 16 groups, 16)
    nb = x.shape[0]
    scale = np.abs(x).max(axis=-1) / 31.0                         # (nb, 16)
    d = _f16(scale.max(axis=-1) / 127.0)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(df[:, None] > 0, np.round(scale / df[:, None]), 0)
    sc = np.clip(sc, -128, 127).astype(np.int8)
    eff = df[:, None] * sc.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(eff[..., None] > 0, np.round(x / eff[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(nb, 256)   # 0..63
    # value index v = h*128 + j*32 + l (h: half 0..1, j: 0..3, l: 0..31)
    qv = q.reshape(nb, 2, 4, 32)
    lo = qv & 0x0F
    hi = qv >> 4
    # ql[h*64 + l'] (l' 0..63): low nibble = value h*128 + l', high nibble = value h*128 + 64 + l'
    ql = (lo[:, :, 0:2, :].reshape(nb, 2, 64) | (lo[:, :, 2:4, :].reshape(nb, 2, 64) << 4))
    # qh[h*32 + l]: bits 2j..2j+1 = high 2 bits of value h*128 + 32j + l
    qh = hi[:, :, 0, :] | (hi[:, :, 1, :] << 2) | (hi[:, :, 2, :] << 4) | (hi[:, :, 3, :] << 6)
    blocks = np.concatenate([ql.reshape(nb, 128), qh.reshape(nb, 64).astype(np.uint8),
                             sc.view(np.uint8), d.view(np.uint8).reshape(nb, 2)], axis=1)
    return blocks.reshape(n, (k // QK_K) * 210)


def encode(w: np.ndarray, t: str) -> tuple[np.ndarray, QT | None]:
    """float32 (n_out, n_in) -> (array for GGUFWriter.add_tensor, raw_dtype)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if t == "F32":
        return w, None
    if t == "F16":
        return w.astype(np.float16), None
    qt = getattr(QT, t)
    if t == "Q4_K":
        return quantize_q4_k(w), qt
    if t == "Q6_K":
        return quantize_q6_k(w), qt
    return gguf.quants.quantize(w, qt), qt


# ---------------------------------------------------------------------------------------------

def float_weights(arch: str, seed: int) -> dict[str, np.ndarray]:
    """All float weights of one architecture, numpy layout (n_out, n_in). Fixed draw order."""
    rng = np.random.Generator(np.random.PCG64([seed, ARCH[arch]["arch_index"]]))

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    n_vocab = 49152
    kv = N_HEAD_KV * HEAD_DIM
    w: dict[str, np.ndarray] = {}
    w["token_embd.weight"] = normal((n_vocab, N_EMBD), 0.5)
    w["output.weight"] = normal((n_vocab, N_EMBD), 0.5)            # used by untied variants
    w["output_norm.weight"] = 1.0 + normal((N_EMBD,), 0.1)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = 1.0 + normal((N_EMBD,), 0.1)
        w[p + "attn_q.weight"] = normal((N_EMBD, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        w[p + "attn_k.weight"] = normal((kv, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        w[p + "attn_v.weight"] = normal((kv, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        w[p + "attn_q.bias"] = normal((N_EMBD,), 0.5)
        w[p + "attn_k.bias"] = normal((kv,), 0.5)
        w[p + "attn_v.bias"] = normal((kv,), 0.1)
        # output projections 4x "unit" scale: the layers must outweigh the (tied) input
        # embedding in the residual stream, else a tied model just predicts its last input token
        w[p + "attn_output.weight"] = normal((N_EMBD, N_EMBD), 4.0 / np.sqrt(N_EMBD))
        w[p + "ffn_norm.weight"] = 1.0 + normal((N_EMBD,), 0.1)
        w[p + "ffn_gate.weight"] = normal((N_FF, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        w[p + "ffn_up.weight"] = normal((N_FF, N_EMBD), 1.0 / np.sqrt(N_EMBD))
        w[p + "ffn_down.weight"] = normal((N_EMBD, N_FF), 4.0 / np.sqrt(N_FF))
    return w


def raw_shapes(arch: str) -> dict[str, tuple]:
    """The shapes float_weights would draw, for the random-block shapes."""
    n_vocab, kv = 49152, N_HEAD_KV * HEAD_DIM
    w: dict[str, tuple] = {"token_embd.weight": (n_vocab, N_EMBD),
                           "output.weight": (n_vocab, N_EMBD), "output_norm.weight": N_EMBD}
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.update({p + "attn_norm.weight": N_EMBD, p + "attn_q.weight": (N_EMBD, N_EMBD),
                  p + "attn_k.weight": (kv, N_EMBD), p + "attn_v.weight": (kv, N_EMBD),
                  p + "attn_q.bias": N_EMBD, p + "attn_k.bias": kv, p + "attn_v.bias": kv,
                  p + "attn_output.weight": (N_EMBD, N_EMBD), p + "ffn_norm.weight": N_EMBD,
                  p + "ffn_gate.weight": (N_FF, N_EMBD), p + "ffn_up.weight": (N_FF, N_EMBD),
                  p + "ffn_down.weight": (N_EMBD, N_FF)})
    return w


def read_tokenizer(path: Path) -> list[tuple[str, object, VT, VT | None]]:
    """Every tokenizer.* key of a GGUF file as (key, value, type, array sub-type)."""
    r = gguf.GGUFReader(str(path))
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = f.types[0]
        if vt == VT.ARRAY:
            st = f.types[1]
            if st == VT.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = [f.parts[i][0].item() for i in f.data]
            out.append((key, val, vt, st))
        elif vt == VT.STRING:
            out.append((key, bytes(f.parts[f.data[0]]), vt, None))
        else:
            out.append((key, f.parts[f.data[0]][0].item(), vt, None))
    return out


def write_model(spec: dict, out_dir: Path, tok, wcache: dict, seed: int) -> Path:
    arch, t, tied = spec["arch"], spec["type"], spec["tied"]
    a = ARCH[arch]
    if RAW:
        if t not in RAW_BLOCK:
            sys.exit(f"--shape with random blocks writes {', '.join(RAW_BLOCK)} only, not {t}")
        w = raw_shapes(arch)
    else:
        if arch not in wcache:
            wcache[arch] = float_weights(arch, seed)
        w = wcache[arch]
    rng = np.random.Generator(np.random.PCG64([seed, 7]))
    path = out_dir / f"{spec['name']}.gguf"
    tmp = path.with_suffix(".gguf.tmp")
    wr = gguf.GGUFWriter(str(tmp), arch)
    wr.add_type("model")
    wr.add_name(spec["name"])
    wr.add_uint32(f"{arch}.block_count", N_LAYER)
    wr.add_uint32(f"{arch}.context_length", N_CTX)
    wr.add_uint32(f"{arch}.embedding_length", N_EMBD)
    wr.add_uint32(f"{arch}.feed_forward_length", N_FF)
    wr.add_uint32(f"{arch}.attention.head_count", N_HEAD)
    wr.add_uint32(f"{arch}.attention.head_count_kv", N_HEAD_KV)
    rope_base = spec.get("rope_base", a["rope_base"])
    wr.add_float32(f"{arch}.rope.freq_base", rope_base)
    wr.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", a["eps"])
    if arch == "llama":  # as in the SmolLM2 file
        wr.add_uint32("llama.vocab_size", 49152)
        wr.add_uint32("llama.rope.dimension_count", HEAD_DIM)
    wr.add_uint32("general.file_type", FILE_TYPE[t])
    if t not in ("F32", "F16", "BF16"):
        wr.add_uint32("general.quantization_version", 2)
    for key, val, vt, st in tok:
        wr.add_key_value(key, val, vt, sub_type=st)

    def put(name: str, arr, mat: bool):
        if RAW and mat:
            wr.add_tensor(name, raw_blocks(arr, t, rng), raw_dtype=getattr(QT, t))
        elif RAW:
            wr.add_tensor(name, np.ones(arr, dtype=np.float32))
        elif mat:
            data, raw = encode(arr, t)
            wr.add_tensor(name, data, raw_dtype=raw)
        else:
            wr.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))

    if spec.get("rope_freqs"):
        put("rope_freqs.weight", llama3_rope_freqs(rope_base), False)
    put("token_embd.weight", w["token_embd.weight"], True)
    put("output_norm.weight", w["output_norm.weight"], False)
    if not tied:
        put("output.weight", w["output.weight"], True)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", w[p + "attn_norm.weight"], False)
        put(p + "attn_q.weight", w[p + "attn_q.weight"], True)
        put(p + "attn_k.weight", w[p + "attn_k.weight"], True)
        put(p + "attn_v.weight", w[p + "attn_v.weight"], True)
        if a["qkv_bias"]:
            put(p + "attn_q.bias", w[p + "attn_q.bias"], False)
            put(p + "attn_k.bias", w[p + "attn_k.bias"], False)
            put(p + "attn_v.bias", w[p + "attn_v.bias"], False)
        put(p + "attn_output.weight", w[p + "attn_output.weight"], True)
        put(p + "ffn_norm.weight", w[p + "ffn_norm.weight"], False)
        put(p + "ffn_gate.weight", w[p + "ffn_gate.weight"], True)
        put(p + "ffn_up.weight", w[p + "ffn_up.weight"], True)
        put(p + "ffn_down.weight", w[p + "ffn_down.weight"], True)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, path)
    return path


def self_check() -> None:
    """The hand-written K-quant encoders must round-trip through gguf's dequantizers."""
    rng = np.random.Generator(np.random.PCG64(1))
    x = rng.standard_normal((4, 512), dtype=np.float32)
    for t, enc, tol in (("Q4_K", quantize_q4_k, 0.12), ("Q6_K", quantize_q6_k, 0.03)):
        y = gguf.quants.dequantize(enc(x), getattr(QT, t)).reshape(x.shape)
        rel = float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x ** 2)))
        if not rel < tol:
            raise SystemExit(f"{t} encoder self-check failed: relative RMS error {rel:.4f}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("--only", nargs="*", default=None, help="model names (default: all)")
    ap.add_argument("--vocab-from", type=Path, default=DEFAULT_VOCAB,
                    help="GGUF whose tokenizer.* keys are copied (default: SmolLM2 in models/)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--list", action="store_true", help="list model names and exit")
    ap.add_argument("--sha256", action="store_true", help="print each file's sha256")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    args = ap.parse_args(argv)

    set_shape(args.shape)
    specs = model_list()
    for sp in specs:
        sp["name"] = sp["name"].replace("tiny", args.shape, 1)
    if args.list:
        for s in specs:
            print(f"{s['name']:24s} arch={s['arch']} type={s['type']} tied={s['tied']}")
        return 0
    if args.out is None:
        ap.error("--out is required")
    if args.only:
        names = {s["name"] for s in specs}
        bad = [n for n in args.only if n not in names]
        if bad:
            ap.error(f"unknown model(s): {', '.join(bad)}")
        specs = [s for s in specs if s["name"] in args.only]
    if not args.vocab_from.is_file():
        sys.exit(f"{args.vocab_from}: not found (run scripts/fetch-models)")
    if not RAW:
        self_check()
    args.out.mkdir(parents=True, exist_ok=True)
    tok = read_tokenizer(args.vocab_from)
    wcache: dict = {}
    for s in specs:
        p = write_model(s, args.out, tok, wcache, args.seed)
        line = f"{p}  {p.stat().st_size} bytes"
        if args.sha256:
            line += f"  sha256={sha256(p)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

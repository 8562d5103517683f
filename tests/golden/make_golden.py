#!/usr/bin/env python3
"""Produce llmgw's golden files from the REFERENCE llama.cpp (via llama-cpp-python).

Reference: scripts/build-llamacpp-ref (llama-cpp-python 0.3.36 = llama.cpp 0c1e57098, built
from the PyPI sdist with GGML_NATIVE=ON). Needs `llama_cpp`, `numpy`, `gguf` (0.19.0).

Writes into tests/golden/ (all small; the tiny models themselves are NOT written here):
  smollm2_gguf_info.json  metadata / tensor table of models/SmolLM2-135M-Instruct.Q4_1.gguf
  smollm2_tokens.json     tokenizer corpus: ids with parse_special True/False + detokenized bytes
  smollm2_logits.json     per prompt: ids, argmax/top-2 margin per position, offsets into .bin
  smollm2_logits.bin      per prompt: last-position logits f32[n_vocab]; top-10 ids i32 and
                          values f32 at every position (little-endian)
  smollm2_greedy.json     64-token pure-argmax continuations
  tiny_golden.json        per tiny model (tools/make_tiny_gguf.py, regenerated into a temp dir):
                          sha256, prompt ids, argmax per position, last-position top-20,
                          16-token greedy continuation

Every llama.cpp context here: n_threads = n_threads_batch = 2, n_batch = n_ubatch = 512,
flash attention off, KV cache f16 (llama.cpp's default), no GPU, logits for every position.
The prompt is decoded as ONE batch; continuation tokens are then decoded one at a time.
Greedy = numpy argmax over llama.cpp's logits (first index on ties), cross-checked against
llama.cpp's own greedy sampler (llama_sampler_init_greedy); no penalties, no EOG stop (the
index of the first end-of-generation token is recorded instead).

Usage: tests/golden/make_golden.py [--model PATH] [--out DIR] [--skip-tiny] [--tiny-dir DIR]
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import importlib.metadata as md
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

import llama_cpp  # noqa: E402
from llama_cpp import llama_cpp as C  # noqa: E402  (low-level ctypes API)

N_THREADS = 2
N_CTX = 1024
N_BATCH = 512
TOPK_ALL = 10     # top-k stored at every position (smollm2_logits.bin)
TOPK_TINY = 20
GREEDY_N = 64
TINY_GREEDY_N = 16


# ---------------------------------------------------------------------------------------------
# corpora

TOKEN_CORPUS: list[tuple[str, str]] = [
    ("empty", ""),
    ("space", " "),
    ("two_spaces", "  "),
    ("hello", "Hello, world!"),
    ("fox", "The quick brown fox jumps over the lazy dog."),
    ("prose", "It was the best of times, it was the worst of times; it was the age of wisdom, "
              "it was the age of foolishness... \"Really?\" she asked (quietly) - and left."),
    ("leading_trailing", "   leading and trailing spaces   "),
    ("newline", "\n"),
    ("newlines", "\n\n\n"),
    ("crlf", "line one\r\nline two\r\n\r\nline four"),
    ("tab", "\t"),
    ("tabs", "a\tb\t\tc\t\t\td"),
    ("trailing_ws_lines", "trailing spaces   \nnext line\t\n  \n"),
    ("ws_mix", " \t \n \r\n  \u00a0 \u3000 x"),
    ("space_runs", "a b  c   d    e     f      g        h"),
    ("python", "def fibonacci(n):\n    if n < 2:\n        return n\n"
               "    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\nprint([fibonacci(i) for i in range(10)])\n"),
    ("c_tabs", "int main(void) {\n\tfor (int i = 0; i < 10; i++) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n\treturn 0;\n}\n"),
    ("json", "{\"name\": \"llmgw\", \"version\": [1, 2, 3], \"ok\": true, \"nested\": {\"x\": null}}"),
    ("markdown", "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n"),
    ("digits_long", "1234567890123456789012345678901234567890"),
    ("numbers", "3.14159 2,718 1e-10 -42 +7 0x1F 1_000_000 007 99.9% $1,234.56 12:30:45 2024-12-02"),
    ("contractions", "I'm you're we'll they've she'd it's don't can't won't y'all"),
    ("contractions_upper", "I'M YOU'RE WE'LL THEY'VE SHE'D IT'S DON'T JOHN'S"),
    ("possessive", "The cat's toy's owner's friend's house"),
    ("url", "https://example.com/path/to/page?q=1&lang=en#frag http://127.0.0.1:8080/v1/chat/completions"),
    ("email", "mail user.name+tag@example.co.uk or <admin@localhost>"),
    ("chinese", "你好，世界！今天天气很好。我们去公园散步吧。"),
    ("japanese", "こんにちは、世界。カタカナとひらがな、そして漢字。"),
    ("korean", "안녕하세요, 세계! 반갑습니다."),
    ("arabic", "مرحبا بالعالم، كيف حالك اليوم؟"),
    ("cyrillic_greek", "Привет, мир! Ёлка. Καλημέρα κόσμε."),
    ("emoji", "I love 🍕 and 🎉!! 😀😃😄"),
    ("emoji_zwj", "👨‍👩‍👧‍👦 family, 👩🏽‍💻 technologist, 🏳️‍🌈 flag, ❤️‍🔥"),
    ("flags", "🇫🇷🇯🇵🇺🇸🇩🇪 flags"),
    ("combining", "e\u0301 vs \u00e9; n\u0303; a\u0308\u0304; Ångström café naïve Zoë"),
    ("math", "∑ ∫ √ ≤ ≥ ≠ ∞ π → ⇒ ∀x∈ℝ"),
    ("mixed_scripts", "Hello世界مرحبا123abcПривет"),
    ("repeats", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!?????...... ----------"),
    ("zero_width", "zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom"),
    ("chatml", "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"),
    ("special_inline", "text<|endoftext|>more text <|im_end|>end"),
    ("special_partial", "<|im_start <|im_end| < |im_start| > <|IM_START|> <|im_start|"),
    ("other_specials", "<repo_name>llmgw<file_sep><filename>main.c<gh_stars>100"),
]

CHAT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

LONG_PROMPT = (
    "The history of computing is a story of abstraction. Early machines were programmed by "
    "rewiring panels and flipping switches, and every program was tied to the physical layout "
    "of the hardware it ran on. The invention of stored-program computers changed that: "
    "instructions became data, and data could be loaded, copied and modified like anything "
    "else. Assemblers turned numeric opcodes into mnemonics, and compilers turned mathematical "
    "formulas into sequences of machine instructions. Operating systems hid the details of "
    "disks, terminals and memory behind files, processes and virtual addresses. Networks "
    "connected machines that had never been designed to talk to one another, and protocols "
    "layered on top of protocols made it possible to send a message across the world without "
    "knowing which cables it would travel through. Each layer made the one below it easier to "
    "forget, and each layer brought its own failures, its own performance surprises and its "
    "own folklore. Today a single request to a language model may pass through a load "
    "balancer, a gateway, a cache, a scheduler and a kernel written for a particular "
    "accelerator, and the people who wrote each of those pieces may never have met. Good "
    "engineering, then, is partly the art of knowing which abstractions to trust, which to "
    "verify, and how to measure the difference between what a system promises and what it "
    "actually does under load. Benchmarks help, but only when they measure the thing that "
    "matters, on hardware that resembles production, with inputs that look like real traffic. "
    "In that spirit, the following chapter examines"
)

LOGIT_PROMPTS: list[tuple[str, str, bool]] = [  # (name, text, parse_special)
    ("chatml", f"<|im_start|>system\n{CHAT_SYSTEM}<|im_end|>\n<|im_start|>user\n"
               "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n", True),
    ("english", "The quick brown fox jumps over the lazy dog. Once upon a time, in a small "
                "village by the sea,", False),
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return", False),
    ("cjk", "中国的首都是北京。日本的首都是", False),
    ("long", LONG_PROMPT, False),
]

GREEDY_PROMPTS: list[tuple[str, str, bool]] = [
    ("chatml_capital", f"<|im_start|>system\n{CHAT_SYSTEM}<|im_end|>\n<|im_start|>user\n"
                       "What is the capital of France?<|im_end|>\n<|im_start|>assistant\n", True),
    ("chatml_code", f"<|im_start|>system\n{CHAT_SYSTEM}<|im_end|>\n<|im_start|>user\n"
                    "Write a Python function that reverses a string.<|im_end|>\n"
                    "<|im_start|>assistant\n", True),
    ("english", "Once upon a time, in a small village by the sea,", False),
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return", False),
    ("list", "Here are five fruits:\n1.", False),
]

TINY_PROMPT = ("<|im_start|>user\nHello, tiny model! Count: one two three.<|im_end|>\n"
               "<|im_start|>assistant\n")


# ---------------------------------------------------------------------------------------------
# llama.cpp helpers (low-level API on top of the high-level Llama object)

def b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def load(path: Path, vocab_only: bool = False) -> llama_cpp.Llama:
    return llama_cpp.Llama(
        model_path=str(path), vocab_only=vocab_only, n_gpu_layers=0, n_ctx=N_CTX,
        n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=N_THREADS, n_threads_batch=N_THREADS,
        logits_all=True, flash_attn=False, seed=0, verbose=False)


def tokenize(llm, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    vocab = llm._model.vocab
    n = C.llama_tokenize(vocab, text, len(text), None, 0, add_special, parse_special)
    n = -n if n < 0 else n
    buf = (C.llama_token * max(n, 1))()
    m = C.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    assert m == n, (m, n)
    return list(buf[:n])


def piece(llm, tok: int, special: bool) -> bytes:
    vocab = llm._model.vocab
    buf = ctypes.create_string_buffer(64)
    n = C.llama_token_to_piece(vocab, tok, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = C.llama_token_to_piece(vocab, tok, buf, -n, 0, special)
    return buf.raw[:n]


def detokenize(llm, toks: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    vocab = llm._model.vocab
    arr = (C.llama_token * max(len(toks), 1))(*toks)
    cap = 64 + 64 * len(toks)
    buf = ctypes.create_string_buffer(cap)
    n = C.llama_detokenize(vocab, arr, len(toks), buf, cap, remove_special, unparse_special)
    assert n >= 0, n
    return buf.raw[:n]


def vocab_info(llm) -> dict:
    v = llm._model.vocab
    info = {
        "n_vocab": C.llama_vocab_n_tokens(v),
        "vocab_type": C.llama_vocab_type(v),
        "bos": C.llama_vocab_bos(v), "eos": C.llama_vocab_eos(v), "eot": C.llama_vocab_eot(v),
        "nl": C.llama_vocab_nl(v), "pad": C.llama_vocab_pad(v), "sep": C.llama_vocab_sep(v),
        "add_bos": bool(C.llama_vocab_get_add_bos(v)), "add_eos": bool(C.llama_vocab_get_add_eos(v)),
    }
    info["eog_ids"] = [t for t in range(info["n_vocab"]) if C.llama_vocab_is_eog(v, t)]
    info["control_ids"] = [t for t in range(info["n_vocab"]) if C.llama_vocab_is_control(v, t)]
    return info


def run_prompt(llm, ids: list[int]) -> np.ndarray:
    """Decode ids as one batch from an empty KV cache; return logits (n, n_vocab) float32."""
    llm.reset()          # n_tokens = 0; eval() then drops KV cells from position 0 on
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)


def greedy(llm, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """Pure argmax continuation; cross-checked with llama.cpp's greedy sampler each step."""
    smpl = C.llama_sampler_init_greedy()
    try:
        logits = run_prompt(llm, ids)[-1]
        out, margins = [], []
        for _ in range(n):
            tok = int(np.argmax(logits))
            ref = C.llama_sampler_sample(smpl, llm._ctx.ctx, -1)
            if ref != tok:
                raise SystemExit(f"llama.cpp greedy sampler chose {ref}, numpy argmax {tok}")
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
            out.append(tok)
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)
        return out, margins
    finally:
        C.llama_sampler_free(smpl)


def topk(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.argsort(-row, kind="stable")[:k]       # ties -> lower id first
    return idx.astype(np.int32), row[idx].astype(np.float32)


def argmax_and_margin(logits: np.ndarray) -> tuple[list[int], list[float]]:
    am = np.argmax(logits, axis=1)
    p = np.partition(logits, -2, axis=1)[:, -2:]
    return [int(x) for x in am], [round(float(x), 5) for x in (p[:, 1] - p[:, 0])]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


# ---------------------------------------------------------------------------------------------

def reference_info() -> dict:
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_commit": "0c1e57098",
        "gguf": md.version("gguf"),
        "numpy": np.__version__,
        "system_info": C.llama_print_system_info().decode().strip(),
        "made_by": "tests/golden/make_golden.py (reference built by scripts/build-llamacpp-ref)",
    }


def context_info() -> dict:
    return {"n_threads": N_THREADS, "n_threads_batch": N_THREADS, "n_ctx": N_CTX,
            "n_batch": N_BATCH, "n_ubatch": N_BATCH, "flash_attn": False,
            "type_k": "f16", "type_v": "f16", "n_gpu_layers": 0,
            "prompt_decoding": "whole prompt in one llama_decode batch, then 1 token per decode"}


def gguf_info(model: Path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(model))
    kv = {}
    for key, f in r.fields.items():
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            kv[key] = {"type": f"ARRAY[{f.types[1].name}]", "len": len(f.data)}
            if len(f.data) <= 16:
                kv[key]["value"] = f.contents()
        else:
            kv[key] = {"type": vt.name, "value": f.contents()}
    tensors = [{"name": t.name, "type": t.tensor_type.name, "shape_ne": [int(x) for x in t.shape],
                "n_bytes": int(t.n_bytes), "offset": int(t.data_offset)} for t in r.tensors]
    return {"file": model.name, "size": model.stat().st_size, "sha256": sha256(model),
            "alignment": r.alignment, "kv": kv, "tensors": tensors}


def chat_template_info(llm) -> dict:
    """The model's template text and how llama.cpp (built-in, non-Jinja) and Jinja2 render it."""
    import jinja2
    import jinja2.sandbox
    tmpl = C.llama_model_chat_template(llm._model.model, None)
    tmpl_s = tmpl.decode("utf-8") if tmpl else None
    convs = {
        "user_only": [("user", "Hello!")],
        "system_user": [("system", CHAT_SYSTEM), ("user", "What is the capital of France?")],
        "multi_turn": [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "2+2?")],
    }
    out = {"template": tmpl_s, "renderings": {}}
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    for name, msgs in convs.items():
        arr = (C.llama_chat_message * len(msgs))(
            *[C.llama_chat_message(r.encode(), c.encode()) for r, c in msgs])
        buf = ctypes.create_string_buffer(8192)
        n = C.llama_chat_apply_template(tmpl, arr, len(msgs), True, buf, 8192)
        builtin = buf.raw[:n].decode("utf-8") if n >= 0 else None
        jin = env.from_string(tmpl_s).render(
            messages=[{"role": r, "content": c} for r, c in msgs], add_generation_prompt=True)
        out["renderings"][name] = {"messages": msgs, "llama_chat_apply_template": builtin,
                                   "jinja2": jin, "identical": builtin == jin}
    return out


def make_tokens(llm, out: Path, vinfo: dict) -> None:
    cases = []
    for name, text in TOKEN_CORPUS:
        raw = text.encode("utf-8")
        case = {"name": name, "text": text, "text_b64": b64(raw)}
        for ps in (True, False):
            ids = tokenize(llm, raw, add_special=True, parse_special=ps)
            ids_nodef = tokenize(llm, raw, add_special=False, parse_special=ps)
            assert ids == ids_nodef or vinfo["add_bos"], "add_special changed ids although add_bos is false"
            key = "special" if ps else "nospecial"
            case[f"ids_{key}"] = ids
            # per-token pieces concatenated; control tokens rendered (special=True) / dropped
            case[f"pieces_{key}_b64"] = b64(b"".join(piece(llm, t, True) for t in ids))
            case[f"pieces_{key}_nocontrol_b64"] = b64(b"".join(piece(llm, t, False) for t in ids))
            case[f"detok_{key}_b64"] = b64(detokenize(llm, ids, False, True))
        cases.append(case)
    doc = {
        "description": "llama.cpp tokenizer output for models/SmolLM2-135M-Instruct.Q4_1.gguf. "
                       "ids_special: llama_tokenize(add_special=true, parse_special=true); "
                       "ids_nospecial: parse_special=false. add_special=true is the llama.cpp "
                       "default and adds nothing here because tokenizer.ggml.add_bos_token=false "
                       "(checked: add_special=false gives the same ids). pieces_*_b64: "
                       "concatenation of llama_token_to_piece(special=true) per id; "
                       "*_nocontrol_b64: special=false (control tokens render as empty); "
                       "detok_*_b64: llama_detokenize(remove_special=false, unparse_special=true).",
        "reference": reference_info(),
        "vocab": {k: v for k, v in vinfo.items() if k != "control_ids"} | {"control_ids": vinfo["control_ids"]},
        "add_special": True,
        "chat_template": chat_template_info(llm),
        "cases": cases,
    }
    write_json(out / "smollm2_tokens.json", doc)


def make_logits(llm, out: Path) -> None:
    n_vocab = llm.n_vocab()
    entries, blobs, off = [], [], 0
    for name, text, ps in LOGIT_PROMPTS:
        ids = tokenize(llm, text.encode("utf-8"), True, ps)
        logits = run_prompt(llm, ids)
        am, margin = argmax_and_margin(logits)
        last = logits[-1].astype("<f4")
        tk = [topk(r, TOPK_ALL) for r in logits]
        tk_ids = np.stack([a for a, _ in tk]).astype("<i4")
        tk_val = np.stack([b for _, b in tk]).astype("<f4")
        e = {"name": name, "text": text, "parse_special": ps, "n_tokens": len(ids), "ids": ids,
             "argmax": am, "top2_margin": margin,
             "last_logits": {"offset": off, "dtype": "float32", "count": n_vocab}}
        blobs.append(last.tobytes()); off += last.nbytes
        e["topk_ids"] = {"offset": off, "dtype": "int32", "shape": [len(ids), TOPK_ALL]}
        blobs.append(tk_ids.tobytes()); off += tk_ids.nbytes
        e["topk_values"] = {"offset": off, "dtype": "float32", "shape": [len(ids), TOPK_ALL]}
        blobs.append(tk_val.tobytes()); off += tk_val.nbytes
        e["last_logits_stats"] = {"min": float(last.min()), "max": float(last.max()),
                                  "mean": float(last.mean()), "std": float(last.std())}
        entries.append(e)
        print(f"  logits {name}: {len(ids)} tokens, argmax(last)={am[-1]}", file=sys.stderr)
    data = b"".join(blobs)
    (out / "smollm2_logits.bin").write_bytes(data)
    doc = {
        "description": "llama.cpp logits for models/SmolLM2-135M-Instruct.Q4_1.gguf. Per prompt: "
                       "token ids (llama_tokenize add_special=true), argmax and top1-top2 margin "
                       "at every position, and in smollm2_logits.bin (little-endian) the full "
                       "last-position logits plus the top-10 ids/values at every position "
                       "(sorted by value desc, ties by lower id). offsets are bytes into the .bin.",
        "reference": reference_info(), "context": context_info(),
        "bin": {"file": "smollm2_logits.bin", "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest()},
        "n_vocab": n_vocab, "topk": TOPK_ALL, "prompts": entries,
    }
    write_json(out / "smollm2_logits.json", doc)


def make_greedy(llm, out: Path, vinfo: dict) -> None:
    eog = set(vinfo["eog_ids"])
    entries = []
    for name, text, ps in GREEDY_PROMPTS:
        ids = tokenize(llm, text.encode("utf-8"), True, ps)
        gen, margins = greedy(llm, ids, GREEDY_N)
        first_eog = next((i for i, t in enumerate(gen) if t in eog), None)
        txt = b"".join(piece(llm, t, True) for t in gen)
        entries.append({"name": name, "prompt": text, "parse_special": ps, "prompt_ids": ids,
                        "ids": gen, "text": txt.decode("utf-8", "replace"), "text_b64": b64(txt),
                        "first_eog_index": first_eog,
                        "min_top2_margin": round(min(margins), 5),
                        "top2_margins": [round(m, 5) for m in margins]})
        print(f"  greedy {name}: {txt[:60]!r} first_eog={first_eog} min_margin={min(margins):.4f}",
              file=sys.stderr)
    doc = {
        "description": "64-token greedy continuations from llama.cpp: argmax of the logits after "
                       "each decode (prompt = one batch, then one token per decode), equal at every "
                       "step to llama.cpp's llama_sampler_init_greedy; no repetition/frequency "
                       "penalty, no temperature, generation does NOT stop at end-of-generation "
                       "tokens (first_eog_index says where llama.cpp would have stopped). text = "
                       "concatenated llama_token_to_piece(special=true).",
        "reference": reference_info(), "context": context_info(),
        "n_generate": GREEDY_N, "eog_ids": sorted(eog), "prompts": entries,
    }
    write_json(out / "smollm2_greedy.json", doc)


def make_tiny(out: Path, vocab_model: Path, tiny_dir: Path | None) -> None:
    import make_tiny_gguf as mt
    tmp = None
    if tiny_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="llmgw-tiny-")
        tiny_dir = Path(tmp.name)
    tiny_dir.mkdir(parents=True, exist_ok=True)
    models = []
    try:
        specs = mt.model_list()
        subprocess.run([sys.executable, str(REPO / "tools" / "make_tiny_gguf.py"), "--out",
                        str(tiny_dir), "--vocab-from", str(vocab_model)], check=True,
                       stdout=sys.stderr)
        for s in specs:
            path = tiny_dir / f"{s['name']}.gguf"
            entry = {"name": s["name"], "arch": s["arch"], "type": s["type"], "tied": s["tied"],
                     "file_size": path.stat().st_size, "sha256": sha256(path)}
            try:
                llm = load(path)
            except Exception as e:  # noqa: BLE001
                entry["load_error"] = str(e)
                print(f"  tiny {s['name']}: llama.cpp REJECTED it: {e}", file=sys.stderr)
                models.append(entry)
                continue
            try:
                ids = tokenize(llm, TINY_PROMPT.encode("utf-8"), True, True)
                logits = run_prompt(llm, ids)
                am, margin = argmax_and_margin(logits)
                ti, tv = topk(logits[-1], TOPK_TINY)
                gen, gmarg = greedy(llm, ids, TINY_GREEDY_N)
                entry.update({
                    "prompt_ids": ids, "argmax": am, "top2_margin": margin,
                    "last_top20_ids": [int(x) for x in ti],
                    "last_top20_values": [float(x) for x in tv],
                    "last_logits_stats": {"min": float(logits[-1].min()), "max": float(logits[-1].max()),
                                          "mean": float(logits[-1].mean()), "std": float(logits[-1].std())},
                    "greedy_ids": gen, "greedy_top2_margins": [round(m, 5) for m in gmarg],
                })
                print(f"  tiny {s['name']}: ok argmax(last)={am[-1]} top1={tv[0]:.4f} "
                      f"min_margin={min(margin):.4f} greedy={gen[:6]}", file=sys.stderr)
            finally:
                llm.close()
            models.append(entry)
    finally:
        if tmp is not None:
            tmp.cleanup()
    doc = {
        "description": "llama.cpp outputs for the tiny random-weight models written by "
                       "tools/make_tiny_gguf.py (default seed; regenerate them with "
                       "`tools/make_tiny_gguf.py --out DIR`, sha256 must match). Per model: "
                       "prompt ids (add_special=true, parse_special=true), argmax and top1-top2 "
                       "margin at every prompt position, last-position top-20 (ids, values; "
                       "sorted desc, ties by lower id) and a 16-token greedy continuation "
                       "(pure argmax, no EOG stop). Random weights give small margins at some "
                       "positions: compare argmax only where top2_margin is comfortably above "
                       "the engine's numeric error.",
        "reference": reference_info(), "context": context_info(),
        "generator": {"tool": "tools/make_tiny_gguf.py", "seed": mt.DEFAULT_SEED,
                      "n_embd": mt.N_EMBD, "n_layer": mt.N_LAYER, "n_head": mt.N_HEAD,
                      "n_head_kv": mt.N_HEAD_KV, "n_ff": mt.N_FF, "n_ctx_train": mt.N_CTX,
                      "arch": mt.ARCH, "vocab_from": vocab_model.name},
        "prompt": TINY_PROMPT, "n_generate": TINY_GREEDY_N, "models": models,
    }
    write_json(out / "tiny_golden.json", doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--skip-tiny", action="store_true")
    ap.add_argument("--only-tiny", action="store_true")
    ap.add_argument("--tiny-dir", type=Path, default=None,
                    help="where to write the tiny models (default: a temp dir, deleted after)")
    args = ap.parse_args()
    if not args.model.is_file():
        sys.exit(f"{args.model}: not found (run scripts/fetch-models)")
    args.out.mkdir(parents=True, exist_ok=True)

    if not args.only_tiny:
        write_json(args.out / "smollm2_gguf_info.json", gguf_info(args.model))
        llm = load(args.model)
        try:
            vinfo = vocab_info(llm)
            make_tokens(llm, args.out, vinfo)
            make_logits(llm, args.out)
            make_greedy(llm, args.out, vinfo)
        finally:
            llm.close()
    if not args.skip_tiny:
        make_tiny(args.out, args.model, args.tiny_dir)

    total = 0
    for p in sorted(args.out.glob("*")):
        if p.suffix in (".json", ".bin"):
            total += p.stat().st_size
            print(f"{p.stat().st_size:>10}  {p.relative_to(REPO) if p.is_relative_to(REPO) else p}")
    print(f"{total:>10}  total")
    return 0


if __name__ == "__main__":
    sys.exit(main())

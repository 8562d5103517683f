#!/usr/bin/env python3
"""Golden data for the MiniLM sentence encoder (engine/encoder/bert.c, tests/unit/engine/encoder/test_bert.c).

Writes tests/golden/minilm_embeddings.json: for each text its UTF-8 bytes (base64, since texts
hold NULs and control characters) and the token ids sentence-transformers feeds the model, and
tests/golden/minilm_embeddings.bin: the embeddings, float32 little-endian, [n][384] in the same
order, from SentenceTransformer(...).encode() on the CPU.

Texts: the first questions of the QQP dev split (see PROVENANCE) and hand-written and seeded
random texts covering code, CJK, emoji, accents, punctuation and whitespace runs, control
characters, special-token texts, long texts past max_seq_length (256 tokens), the empty string
and mixed case.

Usage: HF_HUB_OFFLINE=1 tests/golden/make_minilm_golden.py [MODEL_DIR]
       (default models/all-MiniLM-L6-v2; sentence-transformers and torch from pip)
"""
import base64
import csv
import json
import os
import random
import sys

import numpy as np
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
QQP = os.path.join(os.path.dirname(REPO), "shared", "data", "cache", "qqp_dev.csv")  # ../shared
PROVENANCE = ("QQP (Quora Question Pairs) dev split, GLUE: the question1 and question2 "
              "columns of data rows 1-{rows} of {path}, duplicates dropped")
N_QQP = 200

HAND = [
    "", " ", "\t\n\r ", "Hello world!", "hello WORLD", "HELLO World", "ThIs Is MiXeD cAsE",
    "Café naïve Ångström", "Crème brûlée à la française", "façade coöperate résumé",
    "İstanbul ΣΊΣΥΦΟΣ ὅτι Straße ǅemal ﬁnance ﬀ", "ＡＢＣ ｆｕｌｌ　ｗｉｄｔｈ １２３",
    "e\u0301\u0323 a\u0323\u0301 o\u0308\u0304", "Ω Å K ℃ ½ ² ㎏ ﬂ Ⅻ ⅻ ①",
    "这是一个中文句子。", "日本語のテキストとカタカナ、ひらがな。", "한국어 문장입니다. 안녕하세요",
    "混合 mixed 中文 and English 文字", "\U00020000\U0002A6D6 𠀀 豈 更 \uF900\uFA6D",
    "Emoji: 😀😃😄 🥰 🫠 👍🏽 👨‍👩‍👧‍👦 🇺🇸 🏳️‍🌈", "I ❤ NY ☺ ★ ✓ ✔ ☃ ♥",
    "!!!???...,,,;;;:::", "Wait... what?!?! (really) [yes] {no} <maybe>", "--- *** ### @@@ $$$ %%% ^^^",
    "a-b_c.d/e\\f|g~h`i'j\"k", "«quoted» „German“ ‘single’ “double” — en–dash … ¿¡",
    "words    separated\t\tby\n\n\nmany   \u00a0\u2003\u3000 spaces",
    "zero\u200bwidth\u200cjoin\u200dhere\ufeffbom", "ctrl\x00nul\x01soh\x07bel\x1bescape\x7fdel",
    "c1\x85nel\x9fapc\u00adsoft\u2028line\u2029para", "repl\ufffdacement \ufffd\ufffd chars",
    "def f(x):\n    return x ** 2  # square", "int main(void) { printf(\"%d\\n\", a[i++]); }",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';", "<div class=\"x\">&amp;</div>",
    "https://example.com/path?q=1&r=two#frag", "email me: john.doe+tag@example.co.uk",
    "$1,234.56 vs €99,99 vs ¥1000 vs 3.14159e-10", "2024-01-15T12:34:56Z 10:30pm 1/2/3",
    "[CLS] already here [SEP]", "fill the [MASK] please", "[PAD][PAD] [UNK]", "[mask] is not [MASK",
    "wor[SEP]ld and x[CLS]y", "[[SEP]]", "Русский текст с ёлкой", "Ελληνικά: αβγ ΣΣ ς",
    "العربية مرحبا بالعالم", "עברית שלום", "हिन्दी पाठ कि क्षेत्र", "ภาษาไทย สวัสดี",
    "Tiếng Việt có dấu", "Ünïcödé ÜBER ÄÖÜ äöü", "𝐁𝐨𝐥𝐝 𝑖𝑡𝑎𝑙𝑖𝑐 𝔉𝔯𝔞𝔨𝔱𝔲𝔯", "𝅘𝅥𝅮 𝅗𝅥 𝅘𝅥 musical",
    "∀x ∈ ℝ: x² ≥ 0 ⇒ √x ∈ ℝ₊", "antidisestablishmentarianism", "supercalifragilisticexpialidocious",
    "a" * 99, "b" * 100, "c" * 101, "ab" * 60, "x" * 300 + " tail",
    "tokenization unaffable playing played plays", "unbelievable!!! 100% sure #hashtag @mention",
    "1234567890 3.14 -42 +7 1e10 0x1F", "I'm can't won't they're y'all o'clock",
    "   leading and trailing spaces   ", "\n\nnewlines around\n\n",
]


def long_texts(rng):
    words = ("the quick brown fox jumps over lazy dog while semantic caches answer repeated "
             "questions about embeddings tokens models and gateways").split()
    out = []
    for n in (150, 260, 400, 1000):
        out.append(" ".join(rng.choice(words) for _ in range(n)))
    out.append("。".join("长文本测试" for _ in range(80)))
    out.append("!" * 600)
    out.append("Emoji run " + "😀" * 300)
    return out


def random_texts(rng, n):
    """Seeded random codepoints from every plane, unassigned ones included (no surrogates)."""
    pools = [(0x20, 0x7F), (0x80, 0x800), (0x800, 0x3000), (0x3000, 0xD800), (0xE000, 0x10000),
             (0x10000, 0x20000), (0x20000, 0x30000), (0x30000, 0x110000)]
    out = []
    for i in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = pools[rng.randrange(len(pools))] if rng.random() < 0.6 else (0x20, 0x7F)
            chars.append(chr(rng.randrange(lo, hi)))
            if rng.random() < 0.2:
                chars.append(" ")
        out.append("".join(chars))
    return out


def qqp_texts():
    """The first N_QQP distinct questions and the number of data rows they came from."""
    out, seen = [], set()
    with open(QQP, newline="", encoding="utf-8") as f:
        for rows, row in enumerate(csv.DictReader(f), 1):
            for q in (row["question1"], row["question2"]):
                if q not in seen:
                    seen.add(q)
                    out.append(q)
            if len(out) >= N_QQP:
                return out[:N_QQP], rows
    return out, rows


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "models",
                                                                    "all-MiniLM-L6-v2")
    torch.manual_seed(0)
    rng = random.Random(1234)
    qqp, rows = qqp_texts()
    texts = qqp + HAND + long_texts(rng) + random_texts(rng, 60)
    model = SentenceTransformer(model_dir, device="cpu")
    tok = getattr(model, "preprocess", None) or model.tokenize  # tokenize: before 6.x
    ids = [tok([t])["input_ids"][0].tolist() for t in texts]
    emb = model.encode(texts, batch_size=32, convert_to_numpy=True).astype("<f4")
    assert emb.shape == (len(texts), 384)
    doc = {
        "model": "all-MiniLM-L6-v2",
        "generator": f"sentence-transformers {sentence_transformers.__version__}, torch "
                     f"{torch.__version__}, CPU",
        "provenance": PROVENANCE.format(rows=rows, path=QQP),
        "dim": int(emb.shape[1]),
        "max_seq_length": model.max_seq_length,
        "embeddings": "minilm_embeddings.bin (float32 little-endian, [n][dim])",
        "texts": [{"b64": base64.b64encode(t.encode("utf-8")).decode(), "ids": i}
                  for t, i in zip(texts, ids)],
    }
    with open(os.path.join(HERE, "minilm_embeddings.json"), "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    np.ascontiguousarray(emb).tofile(os.path.join(HERE, "minilm_embeddings.bin"))
    print(f"{len(texts)} texts, {sum(len(i) for i in ids)} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()

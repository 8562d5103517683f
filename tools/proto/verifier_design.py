#!/usr/bin/env python3
"""Design measurement for the semantic cache's verifier (issue 12); not part of the gateway.

Question: does comparing two questions token by token (alignment, word order, negations,
numbers) separate paraphrases from look-alikes better than the pooled cosine the cache uses?
The pairs are embedded with our own encoder (`llmgw-embed --tokens`: contextual token vectors).
Each pair gets 18 features:
  - the pooled cosine;
  - the mean and the minimum of each side's best token match;
  - the share of crossed alignments, and the mean gap in relative position;
  - mutual best matches;
  - negation and number mismatches;
  - the length ratio;
  - word and bigram overlap.
A logistic regression and a 32-unit tanh MLP are fitted on the train split. Each model's
threshold is set on the calib split: the lowest one with at most 1 % false hits among the calib
negatives. The test split is reported per data set.

Splits are by question, so no question is in two splits. A hash of the lower-cased text decides:
60 % train, 20 % calib, 20 % test.
  - PAWS dev: split by sentence1.
  - QQP dev: split by question1.
  - The rule-made pairs of tests/golden/cache: their own split column.
Samples: 4,000 PAWS and 4,000 QQP pairs, and from each rule-made file up to 1,200 train and
700 calib/test pairs. The tokens file takes about 0.7 GB in /tmp/proto. About 10 min on 2 vCPUs.

    python3 tools/proto/verifier_design.py     (needs build/tools/llmgw-embed and numpy)
"""
import os
os.makedirs("/tmp/proto", exist_ok=True)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data", "cache")
import csv, hashlib, random, subprocess, sys, struct
random.seed(7)
def h(s, m=10): return int(hashlib.sha1(s.lower().strip().encode()).hexdigest()[:8], 16) % m
def sp(s):
    x = h(s); return "train" if x < 6 else "calib" if x < 8 else "test"
pairs = []  # (a, b, label, split, set)
# PAWS dev: group by sentence1
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(SHARED, "paws_dev.tsv"), encoding="utf-8")]
random.shuffle(rows)
for r in rows[:4000]:
    pairs.append((r[1], r[2], int(r[3]), sp(r[1]), "paws"))
# QQP dev: group by question1
rows = list(csv.DictReader(open(os.path.join(SHARED, "qqp_dev.csv"), encoding="utf-8")))
random.shuffle(rows)
for r in rows[:4000]:
    pairs.append((r["question1"], r["question2"], int(r["is_duplicate"]), sp(r["question1"]), "qqp"))
# rule-made: their own split
for name in ("rule_paraphrases", "rule_lookalikes", "rule_others"):
    rows = list(csv.DictReader(open(os.path.join(ROOT, "tests", "golden", "cache", "%s.csv" % name), encoding="utf-8")))
    n = {"train": 0, "calib": 0, "test": 0}
    for r in rows:
        lim = 1200 if r["split"] == "train" else 700
        if n[r["split"]] < lim:
            n[r["split"]] += 1
            pairs.append((r["question1"], r["question2"], int(r["is_duplicate"]), r["split"], name.replace("rule_", "rule:")))
texts = []
for a, b, *_ in pairs:
    texts += [a, b]
esc = lambda t: t.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")
inp = "\n".join(esc(t) for t in texts) + "\n"
out = subprocess.run([os.path.join(ROOT, "build", "tools", "llmgw-embed"), "-m", os.path.join(ROOT, "models", "all-MiniLM-L6-v2"), "-t", "1",
                      "--tokens", "/tmp/proto/tok.bin"], input=inp.encode(), capture_output=True)
assert out.returncode == 0, out.stderr
print(len(pairs), "pairs", len(texts), "texts")

# ---- features, models, evaluation ----
import re, numpy as np
b = open("/tmp/proto/tok.bin", "rb").read()
o, toks = 0, []
while o < len(b):
    k = struct.unpack_from("<i", b, o)[0]; o += 4
    ids = np.frombuffer(b, np.int32, k, o); o += 4 * k
    v = np.frombuffer(b, np.float32, k * 384, o).reshape(k, 384); o += 4 * k * 384
    toks.append((ids, v))
assert len(toks) == 2 * len(pairs)
NEG = re.compile(r"\b(not|no|never|n't|cannot|nothing|none|without)\b|n't\b", re.I)
NUM = re.compile(r"\d+(?:\.\d+)?")
WORD = re.compile(r"[a-z0-9']+")

def feats(i):
    (ia, va), (ib, vb) = toks[2 * i], toks[2 * i + 1]
    a, bb = pairs[i][0], pairs[i][1]
    pa = va.mean(0); pa /= np.linalg.norm(pa); pb = vb.mean(0); pb /= np.linalg.norm(pb)
    cos = float(pa @ pb)
    A = va[1:-1] if len(va) > 2 else va; B = vb[1:-1] if len(vb) > 2 else vb
    A = A / np.linalg.norm(A, axis=1, keepdims=True); B = B / np.linalg.norm(B, axis=1, keepdims=True)
    S = A @ B.T
    ab = S.max(1); ba = S.max(0)
    # order: aligned positions' rank correlation
    j = S.argmax(1)
    n = len(j)
    if n > 2:
        x = np.arange(n) / (n - 1); y = j / max(len(B) - 1, 1)
        inv = 0; tot = 0
        for p in range(n):
            for q in range(p + 1, n):
                if ab[p] > 0.6 and ab[q] > 0.6:
                    tot += 1; inv += j[p] > j[q]
        invfrac = inv / tot if tot else 0.0
        pos = float(np.mean(np.abs(x - y)))
    else:
        invfrac, pos = 0.0, 0.0
    # mutual alignment: tokens that align to each other both ways
    jb = S.argmax(0)
    mutual = float(np.mean([jb[j[p]] == p for p in range(n)])) if n else 0.0
    na, nb = len(NEG.findall(a)), len(NEG.findall(bb))
    numa, numb = sorted(NUM.findall(a)), sorted(NUM.findall(bb))
    wa, wb = WORD.findall(a.lower()), WORD.findall(bb.lower())
    sa, sb = set(wa), set(wb)
    jac = len(sa & sb) / max(len(sa | sb), 1)
    # bigram order overlap: words equal, order differs
    bga = set(zip(wa, wa[1:])); bgb = set(zip(wb, wb[1:]))
    bjac = len(bga & bgb) / max(len(bga | bgb), 1)
    return [cos, ab.mean(), ab.min(), ba.mean(), ba.min(), np.sort(ab)[:2].mean(), np.sort(ba)[:2].mean(),
            invfrac, pos, mutual, float(na != nb), abs(na - nb), float(numa != numb),
            min(len(A), len(B)) / max(len(A), len(B)), jac, bjac, jac - bjac, float(sa == sb and wa != wb)]

X = np.array([feats(i) for i in range(len(pairs))], dtype=np.float64)
y = np.array([p[2] for p in pairs], dtype=np.float64)
split = np.array([p[3] for p in pairs]); sets = np.array([p[4] for p in pairs])
mu, sd = X[split == "train"].mean(0), X[split == "train"].std(0) + 1e-9
Z = (X - mu) / sd

def fit_lr(Z, y, l2=1e-3, it=3000, lr=0.5):
    w = np.zeros(Z.shape[1]); b0 = 0.0
    for _ in range(it):
        p = 1 / (1 + np.exp(-(Z @ w + b0)))
        g = p - y
        w -= lr * (Z.T @ g / len(y) + l2 * w); b0 -= lr * g.mean()
    return lambda Q: 1 / (1 + np.exp(-(Q @ w + b0)))

def fit_mlp(Z, y, hid=32, it=4000, lr=0.05, l2=1e-4, seed=0):
    r = np.random.default_rng(seed)
    W1 = r.normal(0, 0.3, (Z.shape[1], hid)); b1 = np.zeros(hid); W2 = r.normal(0, 0.3, hid); b2 = 0.0
    for _ in range(it):
        H = np.tanh(Z @ W1 + b1); p = 1 / (1 + np.exp(-(H @ W2 + b2))); g = (p - y) / len(y)
        gW2 = H.T @ g + l2 * W2; gb2 = g.sum(); gH = np.outer(g, W2) * (1 - H ** 2)
        gW1 = Z.T @ gH + l2 * W1; gb1 = gH.sum(0)
        W1 -= lr * gW1 * 10; b1 -= lr * gb1 * 10; W2 -= lr * gW2 * 10; b2 -= lr * gb2 * 10
    return lambda Q: 1 / (1 + np.exp(-(np.tanh(Q @ W1 + b1) @ W2 + b2)))

tr = split == "train"
lr_m = fit_lr(Z[tr], y[tr]); mlp_m = fit_mlp(Z[tr], y[tr])
scores = {"cosine only": X[:, 0], "alignment LR": lr_m(Z), "alignment MLP": mlp_m(Z)}
def auc(s, y):
    o = np.argsort(s); r = np.empty(len(s)); r[o] = np.arange(len(s))
    pos = y == 1; return (r[pos].sum() - pos.sum() * (pos.sum() - 1) / 2) / (pos.sum() * (~pos).sum())
print("pairs: train %d, calib %d, test %d" % (tr.sum(), (split == "calib").sum(), (split == "test").sum()))
for name, s in scores.items():
    # operating point: on calib rows, the lowest threshold whose false-hit rate (of negatives) <= 1%
    cal = split == "calib"
    neg = np.sort(s[cal & (y == 0)])
    thr = neg[int(np.ceil(0.99 * len(neg))) - 1] + 1e-9 if len(neg) else 0.5
    print("\n== %s (threshold %.4f from calib, 1%% false hits of calib negatives)" % (name, thr))
    for st in ("paws", "qqp", "rule:paraphrases", "rule:lookalikes", "rule:others"):
        m = (split == "test") & (sets == st)
        if not m.any(): continue
        hit = s[m] >= thr; yy = y[m]
        tp = (hit & (yy == 1)).sum(); fp = (hit & (yy == 0)).sum()
        P = yy.sum(); N = (yy == 0).sum()
        a = auc(s[m], yy) if 0 < P < m.sum() else float("nan")
        print("  test %-17s n=%4d  recall %.3f  false hits %3d/%4d (%.1f%%)  precision %.3f  AUC %s" % (
            st, m.sum(), tp / P if P else float("nan"), fp, N, 100 * fp / N if N else 0,
            tp / (tp + fp) if tp + fp else float("nan"), "%.3f" % a if a == a else "-"))

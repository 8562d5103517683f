#!/usr/bin/env python3
"""Rule-made question pairs for the semantic cache's verifier (issue 12), from Quora questions.

Reads the question1 column of ../shared/data/cache/qqp_dev.csv (Quora Question Pairs via
GPTCache, see ../shared/data/README) and writes three CSVs here, each
`question1,question2,is_duplicate,split,rule`:

  rule_paraphrases.csv  the same question said differently by rules that keep its meaning:
                        case, punctuation, contractions both ways, safe synonyms, a polite
                        prefix, and reordering where order does not matter ("between A and B",
                        "A or B"). is_duplicate = 1.
  rule_lookalikes.csv   near-copies whose meaning changed: a number changed, a negation added,
                        an antonym, a direction reversed ("from A to B", "A than B", "convert A to
                        B"), two named things swapped. is_duplicate = 0. These are what a cosine
                        cannot tell apart.
  rule_others.csv       every paraphrase's original against other questions of the same split
                        (same first word, so topically close): is_duplicate = 0. "Zero false hits
                        against other questions" is measured here.

Each source question gets a split by a hash of its lower-cased text, so one question and every
pair made from it land in one split: train (60 %), calib (20 %), test (20 %). Never report a
figure on the train or calib rows of a model trained or calibrated on them.

Deterministic: the same input gives the same files (seeded by the question's hash). Each file
keeps a hash-ordered sample of at most --max-train pairs from train questions and --max-eval
from each of calib and test (run with larger limits to make more training pairs).

    python3 tests/golden/cache/make_rule_pairs.py [--data ../shared/data/cache/qqp_dev.csv]
"""
import argparse
import csv
import hashlib
import random
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

CONTRACTIONS = [
    ("what is", "what's"), ("it is", "it's"), ("do not", "don't"), ("does not", "doesn't"),
    ("did not", "didn't"), ("cannot", "can't"), ("i am", "i'm"), ("is not", "isn't"),
    ("are not", "aren't"), ("should not", "shouldn't"), ("would not", "wouldn't"),
    ("how is", "how's"), ("who is", "who's"), ("where is", "where's"), ("there is", "there's"),
    ("you are", "you're"), ("i have", "i've"), ("they are", "they're"), ("we are", "we're"),
    ("will not", "won't"), ("that is", "that's"),
]
SYNONYMS = [
    ("movie", "film"), ("movies", "films"), ("buy", "purchase"), ("begin", "start"),
    ("big", "large"), ("car", "automobile"), ("kids", "children"), ("photo", "picture"),
    ("photos", "pictures"), ("shop", "store"), ("quickly", "fast"), ("how can i", "how do i"),
    ("cell phone", "mobile phone"), ("help", "assist"), ("doctor", "physician"),
    ("find out", "discover"), ("enormous", "huge"), ("tiny", "very small"),
]
ANTONYMS = [
    ("best", "worst"), ("increase", "decrease"), ("before", "after"), ("buy", "sell"),
    ("cheap", "expensive"), ("advantages", "disadvantages"), ("gain", "lose"), ("rich", "poor"),
    ("love", "hate"), ("most", "least"), ("first", "last"), ("men", "women"), ("easy", "hard"),
    ("good", "bad"), ("win", "lose"), ("high", "low"), ("true", "false"), ("hot", "cold"),
    ("legal", "illegal"), ("possible", "impossible"), ("strong", "weak"), ("young", "old"),
]
AUX = ["is", "are", "can", "does", "do", "should", "will", "would", "could", "did", "was", "were"]
POLITE = ["Please tell me: ", "Can you tell me ", "I'd like to know: ", "Quick question: "]


def word_sub(text, a, b):
    """Replaces whole-word occurrences of a (case-insensitive) with b, keeping a leading capital."""
    pat = re.compile(r"\b%s\b" % re.escape(a), re.I)

    def rep(m):
        s = m.group(0)
        return b[0].upper() + b[1:] if s[0].isupper() else b
    return pat.sub(rep, text)


def has_word(text, w):
    return re.search(r"\b%s\b" % re.escape(w), text, re.I) is not None


# ---- meaning-keeping rules: each returns a new text or None ----------------------------------

def r_case(q, rnd):
    out = q.lower() if rnd.random() < 0.7 else q.upper()
    return out if out != q else None


def r_punct(q, rnd):
    if q.endswith("?"):
        out = q[:-1].rstrip()
    else:
        out = q.rstrip(".!") + "?"
    if rnd.random() < 0.5:
        out = out.replace(",", "")
    return out if out != q else None


def r_contract(q, rnd):
    pairs = CONTRACTIONS[:]
    rnd.shuffle(pairs)
    for long, short in pairs:
        if has_word(q, long):
            return word_sub(q, long, short)
        if re.search(r"\b%s\b" % re.escape(short), q, re.I):
            return re.sub(r"\b%s\b" % re.escape(short), lambda m: long.capitalize() if m.group(0)[0].isupper() else long, q, flags=re.I)
    return None


def swap_word(q, rnd, table):
    """One word of a (random) pair of the table replaced by the other, either way; or None."""
    pairs = table[:]
    rnd.shuffle(pairs)
    for a, b in pairs:
        if has_word(q, a):
            return word_sub(q, a, b)
        if has_word(q, b):
            return word_sub(q, b, a)
    return None


def r_synonym(q, rnd):
    return swap_word(q, rnd, SYNONYMS)


def r_polite(q, rnd):
    p = rnd.choice(POLITE)
    return p + q[0].lower() + q[1:] if q else None


def r_reorder(q, rnd):
    m = re.search(r"\bbetween (\w+(?: \w+)?) and (\w+(?: \w+)?)\b", q)
    if m and m.group(1).lower() != m.group(2).lower():
        return q[:m.start()] + "between %s and %s" % (m.group(2), m.group(1)) + q[m.end():]
    m = re.search(r"\b(\w+), (\w+) or (\w+)\?$", q)  # "Which is better, A or B?"
    if m and m.group(2).lower() != m.group(3).lower():
        return q[:m.start()] + "%s, %s or %s?" % (m.group(1), m.group(3), m.group(2))
    return None


KEEP = [("case", r_case), ("punct", r_punct), ("contraction", r_contract),
        ("synonym", r_synonym), ("polite", r_polite), ("reorder", r_reorder)]


# ---- meaning-changing rules ----------------------------------------------------------------

def n_number(q, rnd):
    nums = list(re.finditer(r"\b\d+\b", q))
    if not nums:
        return None
    m = rnd.choice(nums)
    v = int(m.group(0))
    w = v + rnd.choice([1, 2, 10]) if v < 1000 or v > 2100 else v + rnd.choice([-3, -1, 1, 5])
    return q[:m.start()] + str(w) + q[m.end():]


PRONOUNS = ("i", "you", "we", "they", "he", "she", "it")


def n_negate(q, rnd):
    """An auxiliary followed by a pronoun gets "not" after the pronoun: "How can I lose weight?"
    -> "How can I not lose weight?", "Is it safe to ...?" -> "Is it not safe to ...?". Only
    there, so the question stays natural."""
    words = q.split(" ")
    for i, w in enumerate(words[:-2]):
        if w.lower() in AUX and words[i + 1].lower() in PRONOUNS and words[i + 2].lower() != "not":
            return " ".join(words[:i + 2] + ["not"] + words[i + 2:])
    return None


def n_antonym(q, rnd):
    return swap_word(q, rnd, ANTONYMS)


def n_direction(q, rnd):
    for pat, fmt in ((r"\bfrom (\w+(?: \w+)?) to (\w+(?: \w+)?)\b", "from %s to %s"),
                     (r"\bconvert (\w+) to (\w+)\b", "convert %s to %s"),
                     (r"\b(\w+) (better|worse|bigger|smaller|faster|slower|cheaper|stronger) than (\w+)\b", None)):
        m = re.search(pat, q, re.I)
        if not m:
            continue
        if fmt is None:
            a, comp, b = m.group(1), m.group(2), m.group(3)
            if a.lower() == b.lower() or a.lower() in AUX:
                continue
            return q[:m.start()] + "%s %s than %s" % (b, comp, a) + q[m.end():]
        a, b = m.group(1), m.group(2)
        if a.lower() == b.lower():
            continue
        return q[:m.start()] + fmt % (b, a) + q[m.end():]
    return None


def n_swap_names(q, rnd):
    if re.search(r"\b(between|and|or|vs|versus)\b", q, re.I):
        return None  # a symmetric relation: swapping would keep the meaning
    words = q.split(" ")
    caps = [i for i, w in enumerate(words) if i > 0 and re.fullmatch(r"[A-Z][a-z]{2,}", w)]
    if len(caps) < 2:
        return None
    i, j = caps[0], caps[1]
    if words[i] == words[j]:
        return None
    words[i], words[j] = words[j], words[i]
    return " ".join(words)


CHANGE = [("number", n_number), ("negation", n_negate), ("antonym", n_antonym),
          ("direction", n_direction), ("swap_names", n_swap_names)]


def split_of(q):
    h = int(hashlib.sha1(q.lower().strip().encode()).hexdigest()[:8], 16) % 10
    return "train" if h < 6 else "calib" if h < 8 else "test"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "cache" / "qqp_dev.csv"))
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--max-train", type=int, default=4000, help="pairs per file from train questions")
    ap.add_argument("--max-eval", type=int, default=1500, help="pairs per file from calib and from test questions")
    a = ap.parse_args()
    seen, questions = set(), []
    with open(a.data, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            for q in (row["question1"], row["question2"]):
                q = " ".join(q.split())
                # one question per wording: two that differ only in case or punctuation
                # ("...biostatics.?" / "...biostatics?") are the same question, never "another"
                key = " ".join(re.findall(r"[a-z0-9]+", q.lower()))
                if 12 <= len(q) <= 160 and key not in seen:
                    seen.add(key)
                    questions.append(q)
    by_split_word = {}
    for q in questions:
        by_split_word.setdefault((split_of(q), q.split(" ")[0].lower()), []).append(q)

    para, looks, others = [], [], []
    for q in questions:
        seed = int(hashlib.sha1(q.encode()).hexdigest()[:12], 16)
        rnd = random.Random(seed)
        sp = split_of(q)
        # one paraphrase per question, by one or two rules
        rules = KEEP[:]
        rnd.shuffle(rules)
        want = 2 if rnd.random() < 0.4 else 1
        out, used = q, []
        for name, fn in rules:
            t = fn(out, rnd)
            if t is not None and t != out:
                out, used = t, used + [name]
            if len(used) == want:
                break
        if used and out != q:
            para.append((q, out, 1, sp, "+".join(used)))
            pool = [o for o in by_split_word.get((sp, q.split(" ")[0].lower()), []) if o != q]
            if pool:
                others.append((q, rnd.choice(pool), 0, sp, "other"))
        # one look-alike per question when a rule applies
        changes = CHANGE[:]
        rnd.shuffle(changes)
        for name, fn in changes:
            t = fn(q, rnd)
            if t is not None and t != q:
                looks.append((q, t, 0, sp, name))
                break
    cap = {"train": a.max_train, "calib": a.max_eval, "test": a.max_eval}

    def capped(rows):
        # a deterministic sample per split (by the pair's hash), so the files stay small
        rows = sorted(rows, key=lambda r: hashlib.sha1((r[0] + "\x00" + r[1]).encode()).hexdigest())
        kept, n = [], {}
        for r in rows:
            if n.get(r[3], 0) < cap[r[3]]:
                n[r[3]] = n.get(r[3], 0) + 1
                kept.append(r)
        return kept
    para, looks, others = capped(para), capped(looks), capped(others)
    out = Path(a.out)
    for name, rows in (("rule_paraphrases.csv", para), ("rule_lookalikes.csv", looks),
                       ("rule_others.csv", others)):
        with open(out / name, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["question1", "question2", "is_duplicate", "split", "rule"])
            w.writerows(rows)
        counts = {}
        for r in rows:
            counts[r[3]] = counts.get(r[3], 0) + 1
        print("%s: %d pairs (%s)" % (name, len(rows), ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""bench/replay end to end: bench/replay/run over a tiny hand-made workload (real MMLU prompts, so
the classifier routes them as it would), a real llmgw and the recorded-outcome upstream, with
the accounting checked line by line; the upstream's answers and errors; the shipped workload's
generator is deterministic and made the committed file; the per-fold training path runs."""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from llmgw_it import LLMGW_BIN, ROOT

BENCH = ROOT / "bench" / "replay" / "run"
UPSTREAM = ROOT / "bench" / "replay" / "upstream.py"
MAKE = ROOT / "scripts" / "make-replay-workload"
MMLU = ROOT.parent / "shared" / "data" / "router" / "mmlu"
WEIGHTS = ROOT / "policies" / "router.weights"
TRAIN_BIN = ROOT / "build" / "tools" / "llmgw-train-router"


def mmlu_prompt(subject, row):
    with open(MMLU / ("mmlu_%s.csv" % subject), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))[row]["prompt"]


def line(id_, fold, question, text, small, large, kind="first"):
    """small/large: (correct, prompt_tokens, completion_tokens); correct None = ungraded."""
    out = {}
    for tier, (ok, pt, ct) in (("small", small), ("large", large)):
        out[tier] = {"answer": "%s answer to %s" % (tier, question), "prompt_tokens": pt,
                     "completion_tokens": ct, "correct": ok}
    return {"id": id_, "fold": fold, "question": question, "kind": kind,
            "request": {"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]},
            "outcomes": out}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The workload: fold 0 asks A, B, A again (an exact hit), W (another question whose text is
    B's with a space doubled: an exact-key hit serving B's answer, a WRONG hit), and a Quora
    non-duplicate pair from the verifier's test split (a number changed: the second must not be
    served the first's answer; both route to one tier today, so the verifier decides); fold 1,
    on a fresh gateway, asks A again (a miss) and C."""
    d = tmp_path_factory.mktemp("replay")
    a = mmlu_prompt("high_school_macroeconomics", 385)
    b = mmlu_prompt("high_school_macroeconomics", 336)
    c = mmlu_prompt("anatomy", 2)
    w = b.replace(" ", "  ", 1)
    lines = [
        line("a1", 0, "A", a, (False, 1000, 200), (True, 1000, 300)),
        line("b1", 0, "B", b, (True, 400, 100), (False, 400, 120)),
        line("a2", 0, "A", a, (False, 1000, 200), (True, 1000, 300), kind="repeat"),
        line("w1", 0, "W", w, (True, 401, 100), (True, 401, 120), kind="distractor"),
        line("d1", 0, "D1", "How do I study 30 chapters in 30 days?", (None, 20, 30), (None, 20, 30)),
        line("d2", 0, "D2", "How do I study 23 chapters in 30 days?", (None, 18, 30), (None, 18, 30),
             kind="distractor"),
        line("a3", 1, "A", a, (False, 1000, 200), (True, 1000, 300), kind="repeat"),
        line("c1", 1, "C", c, (True, 50, 7), (True, 50, 9)),
    ]
    path = d / "tiny.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    wdir = d / "weights"
    wdir.mkdir()
    for k in (0, 1):
        shutil.copy(WEIGHTS, wdir / ("fold%d.weights" % k))
    if WEIGHTS.with_suffix(".knn").exists():  # the classifier's kNN vectors, named by the weights
        shutil.copy(WEIGHTS.with_suffix(".knn"), wdir)
    return path, wdir, {x["id"]: x for x in lines}


def run_bench(args, timeout=120):
    env = dict(os.environ, LLMGW_BIN=str(LLMGW_BIN))
    p = subprocess.run([sys.executable, str(BENCH)] + args, capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=str(ROOT))
    return p


def cost(prices, tier, o):
    return (o["prompt_tokens"] * prices[tier][0] + o["completion_tokens"] * prices[tier][1]) / 1e6


def test_replay_accounting(tiny, tmp_path):
    path, wdir, lines = tiny
    out = tmp_path / "out.json"
    p = run_bench(["--workload", str(path), "--fold-weights", str(wdir), "--json", str(out), "--per-fold"])
    assert p.returncode == 0, "bench/replay/run failed (rc %d):\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    res = json.loads(out.read_text())
    assert not res["problems"]
    prices = res["prices"]
    recs = {r["id"]: r for r in res["requests"]}
    assert list(recs) == ["a1", "b1", "a2", "w1", "d1", "d2", "a3", "c1"]

    # the cases the workload was made for
    assert recs["a1"]["cache"] == "miss" and recs["b1"]["cache"] == "miss"
    assert recs["a2"]["cache"] == "exact", recs["a2"]
    assert recs["a2"]["tier"] == recs["a1"]["tier"] and recs["a2"]["cost"] == 0
    assert recs["w1"]["tier"] == recs["b1"]["tier"], (
        "precondition: B and its whitespace twin must route alike (%s / %s)"
        % (recs["b1"]["route_reason"], recs["w1"]["route_reason"]))
    assert recs["w1"]["cache"] == "exact" and recs["w1"]["wrong_hit"], recs["w1"]
    assert recs["w1"]["served_question"] == "B" and recs["w1"]["correct"] is False
    assert not recs["d2"]["hit"] and not recs["d2"]["wrong_hit"], recs["d2"]
    assert recs["d2"]["correct"] is None
    assert recs["a3"]["cache"] == "miss", "fold 1 must start with an empty cache: %r" % recs["a3"]

    # every line: cost = prices x recorded tokens of the answering tier (0 on a hit), as the
    # gateway's own header says; correctness = that tier's recorded outcome for this question
    want_correct, want_cost, router_cost, router_ok = [], 0.0, 0.0, []
    for id_, r in recs.items():
        o = lines[id_]["outcomes"]
        c = 0.0 if r["hit"] else cost(prices, r["tier"], o[r["tier"]])
        assert r["cost"] == pytest.approx(c, abs=1e-12), id_
        assert r["cost_header"] == pytest.approx(c, abs=1e-8), id_
        want_cost += c
        router_cost += cost(prices, r["tier"], o[r["tier"]])
        ok = o[r["tier"]]["correct"]
        if ok is not None:
            router_ok.append(ok)
            want_correct.append(False if id_ == "w1" else ok)
            assert r["correct"] is want_correct[-1], id_
    graded = [x for x in lines.values() if x["outcomes"]["large"]["correct"] is not None]
    rows = res["rows"]
    n = len(lines)
    large = rows["always-large"]
    assert large["cost"] == pytest.approx(sum(cost(prices, "large", x["outcomes"]["large"]) for x in lines.values()))
    assert large["accuracy"] == pytest.approx(sum(x["outcomes"]["large"]["correct"] for x in graded) / len(graded))
    small = rows["always-small"]
    assert small["cost"] == pytest.approx(sum(cost(prices, "small", x["outcomes"]["small"]) for x in lines.values()))
    assert small["accuracy"] == pytest.approx(sum(x["outcomes"]["small"]["correct"] for x in graded) / len(graded))
    gw = rows["llmgw (router + cache)"]
    assert gw["requests"] == n and gw["cost"] == pytest.approx(want_cost)
    assert gw["accuracy"] == pytest.approx(sum(want_correct) / len(want_correct))
    assert gw["hit_share"] == pytest.approx(2 / n) and gw["wrong_hits"] == 1
    assert gw["strong_share"] == pytest.approx(sum(r["tier"] == "large" and not r["hit"] for r in recs.values()) / n)
    assert gw["cost_vs_large"] == pytest.approx(want_cost / large["cost"])
    assert gw["accuracy_vs_large"] == pytest.approx(gw["accuracy"] / large["accuracy"])
    router = rows["llmgw router only"]
    assert router["cost"] == pytest.approx(router_cost)
    assert router["accuracy"] == pytest.approx(sum(router_ok) / len(router_ok))
    rnd = rows["random, cost of llmgw"]
    share = min(1, max(0, (want_cost - small["cost"]) / (large["cost"] - small["cost"])))
    assert rnd["strong_share"] == pytest.approx(share)
    assert rnd["accuracy"] == pytest.approx(small["accuracy"] + share * (large["accuracy"] - small["accuracy"]))
    assert set(res["per_fold"]) == {"0", "1"} and res["per_fold"]["1"]["llmgw (router + cache)"]["requests"] == 2

    # the printed table carries the same numbers
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("| llmgw (router + cache) |"))
    cells = [x.strip() for x in row.strip("|").split("|")]
    assert cells[1] == str(n) and cells[2] == "%.4f" % want_cost and cells[-1] == "1"
    assert "w1 (distractor): W served B's answer, exact hit" in p.stdout


def test_replay_upstream(tiny, tmp_path):
    path, _, lines = tiny
    log = open(tmp_path / "upstream.log", "w")
    up = subprocess.Popen([sys.executable, str(UPSTREAM), "--workload", str(path), "--port", "0"],
                          stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        port = int(re.match(r"replay-upstream listening on (\d+)", up.stdout.readline()).group(1))
        url = "http://127.0.0.1:%d/v1/chat/completions" % port
        b = lines["b1"]["request"]
        r = requests.post(url, json=dict(b, model="large", messages=[{"content": b["messages"][0]["content"],
                                                                      "role": "user"}]), timeout=10)
        assert r.status_code == 200, r.text
        j = r.json()
        assert j["choices"][0]["message"]["content"] == "large answer to B"
        assert j["usage"] == {"prompt_tokens": 400, "completion_tokens": 120, "total_tokens": 520}
        r = requests.post(url, json={"model": "small", "messages": [{"role": "user", "content": "not recorded"}]},
                          timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_prompt", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == "messages"
        r = requests.post(url, json=dict(b, model="medium"), timeout=10)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
        r = requests.post(url, json=dict(b, model="small", stream=True, stream_options={"include_usage": True}),
                          timeout=10)
        events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"]) == \
            "small answer to B"
        assert events[-1]["usage"]["completion_tokens"] == 100 and r.text.rstrip().endswith("data: [DONE]")
        stats = requests.get("http://127.0.0.1:%d/replay/stats" % port, timeout=10).json()
        assert stats["calls"] == {"large": 1, "small": 1} and stats["errors"] == 2
    finally:
        up.terminate()
        up.wait(5)
        log.close()


def test_make_replay_workload_deterministic(tmp_path):
    outs = []
    for i in (1, 2):
        out = tmp_path / ("w%d.jsonl" % i)
        p = subprocess.run([sys.executable, str(MAKE), "--out", str(out)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] == (ROOT / "bench" / "replay" / "mmlu.jsonl").read_bytes(), \
        "bench/replay/mmlu.jsonl is not what scripts/make-replay-workload makes: rerun it and commit"
    assert len(outs[0]) < 3 << 20


def test_replay_trains_fold_weights(tmp_path):
    """The default path: the fold's weights trained with its subjects held out (train_command)."""
    if not TRAIN_BIN.exists():
        pytest.fail("%s not found: cmake --build build --target llmgw-train-router" % TRAIN_BIN, pytrace=False)
    out = tmp_path / "out.json"
    p = run_bench(["--folds", "4", "--limit", "3", "--save-weights", str(tmp_path / "w"), "--json", str(out)])
    assert p.returncode == 0, "rc %d:\n%s\n%s" % (p.returncode, p.stdout, p.stderr)
    assert (tmp_path / "w" / "fold4.weights").stat().st_size > 0
    assert (tmp_path / "w" / "fold4.knn").stat().st_size > 0
    assert "trained without college_computer_science,global_facts,high_school_statistics,moral_disputes," \
           "public_relations" in p.stderr
    res = json.loads(out.read_text())
    assert [r["id"] for r in res["requests"]] == ["f4-000", "f4-001", "f4-002"]

"""The routing policy end to end: rules, the classifier, decision headers and costs, the dry-run
endpoint, live reload (inotify and SIGHUP) with broken edits, max_concurrent and fallback
chains, `llmgw --check-policy`. Real llmgw and stub-upstream processes, the openai SDK."""

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from llmgw_it import (LLMGW_BIN, ROOT, Gateway, Stub, base_config, free_port, metric_sum, metric_value,
                      uniq, wait_until)

ENCODER_DIR = Path(os.environ.get("LLMGW_ENCODER_MODEL") or ROOT / "models" / "all-MiniLM-L6-v2")
WEIGHTS = Path(os.environ.get("LLMGW_ROUTER_WEIGHTS") or ROOT / "policies" / "router.weights")

PRICES = {"small": (0.15, 0.60), "large": (2.50, 10.00), "slow": (0.15, 0.60)}


def policy_yaml(rules, default="small", extra_tiers="", small_conc=0, classifier=True):
    head = ("version: 1\nmodels: [auto, gpt-4o-mini, gpt-4o, flaky-model]\ndefault_tier: %s\n"
            "reference_tier: large\n" % default)
    if classifier:
        head += "classifier: {weights: %s}\n" % WEIGHTS
    tiers = """tiers:
  small:
    price: {input_per_1m: 0.15, output_per_1m: 0.60}
    context: 8192
    max_concurrent: %d
    fallback: [large]
  large:
    price: {input_per_1m: 2.50, output_per_1m: 10.00}
    context: 8192
  dead:
    price: {input_per_1m: 0.10, output_per_1m: 0.40}
    fallback: [small, large]
""" % small_conc
    return head + tiers + extra_tiers + "rules:\n" + rules


BASE_RULES = """  - name: to-dead
    match: {model: [flaky-model]}
    tier: dead
  - name: pinned-large
    match: {model: [gpt-4o]}
    tier: large
  - name: vip
    match: {group: [vip]}
    tier: large
  - name: header-override
    match: {header: {x-route-to: "^large$"}}
    tier: large
  - name: code
    match: {regex: ['```', '\\bdef\\s+\\w+\\(']}
    tier: large
  - name: incident
    match: {keywords: [stack trace, segfault]}
    tier: large
  - name: hard
    match: {model: [auto], score: {min: 0.5}}
    tier: large
"""


def gw_config(stub, policy_path, cache=True):
    tiers = [
        {"name": "small", "kind": "upstream", "base_url": stub.base_url, "model": "stub-small"},
        {"name": "large", "kind": "upstream", "base_url": stub.base_url, "model": "stub-large"},
        {"name": "remote", "kind": "upstream", "base_url": stub.base_url, "model": "stub-remote"},
        {"name": "dead", "kind": "upstream", "base_url": "http://127.0.0.1:1/v1", "connect_timeout_ms": 300,
         "retries": 0},
    ]
    keys = [{"key": "sk-test-a", "group": "team-a"}, {"key": "sk-test-vip", "group": "vip"}]
    cfg = base_config(free_port(), tiers=tiers, keys=keys,
                      limits={"request_timeout_ms": 30000, "read_timeout_ms": 30000})
    cfg["encoder"] = {"model_dir": str(ENCODER_DIR), "threads": 1}
    if cache:
        cfg["cache"] = {"enabled": True, "threshold": 0.985}
    cfg["policy"] = str(policy_path)
    return cfg


@pytest.fixture(scope="module")
def rdir(tmp_path_factory):
    if not WEIGHTS.is_file():
        pytest.fail("policies/router.weights is missing", pytrace=False)
    return tmp_path_factory.mktemp("route")


@pytest.fixture(scope="module")
def stub(rdir):
    s = Stub(rdir, "routestub", chunk_delay=0.001)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def policy_file(rdir):
    p = rdir / "policy" / "policy.yaml"
    p.parent.mkdir()
    p.write_text(policy_yaml(BASE_RULES))
    return p


@pytest.fixture(scope="module")
def gw(rdir, stub, policy_file):
    g = Gateway(rdir / "gw", gw_config(stub, policy_file), dev_tls=False).start()
    yield g
    assert g.stop() == 0, g.log_tail()


def chat(gw, text, model="auto", key="sk-test-a", headers=None, **kw):
    kw.setdefault("temperature", 0.7)  # not cacheable: every call reaches the router and the stub
    r = requests.post(gw.http + "/v1/chat/completions", timeout=30,
                      headers=dict({"Authorization": "Bearer " + key}, **(headers or {})),
                      json=dict({"model": model, "messages": [{"role": "user", "content": text}]}, **kw))
    return r


def dry(gw, text, model="auto", key="sk-test-a", headers=None):
    r = requests.post(gw.http + "/v1/llmgw/route", timeout=30,
                      headers=dict({"Authorization": "Bearer " + key}, **(headers or {})),
                      json={"model": model, "temperature": 0.7, "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()


def metrics(gw):
    return requests.get(gw.http + "/metrics", timeout=5).text


# ------------------------------------------------------------------------------------ rules

@pytest.mark.parametrize("kwargs,tier,rule", [
    ({"model": "gpt-4o"}, "large", "pinned-large"),
    ({"key": "sk-test-vip", "model": "gpt-4o-mini"}, "large", "vip"),
    ({"model": "gpt-4o-mini", "headers": {"x-route-to": "large"}}, "large", "header-override"),
    ({"model": "gpt-4o-mini", "text": "Why does this fail?\n```\nx = 1/0\n```"}, "large", "code"),
    ({"model": "gpt-4o-mini", "text": "Here is a STACK TRACE from prod"}, "large", "incident"),
    ({"model": "gpt-4o-mini", "text": "def main(): pass -- why?"}, "large", "code"),
    ({"model": "gpt-4o-mini"}, "small", None),
])
def test_rules_pick_tiers(gw, stub, kwargs, tier, rule):
    m = uniq("rule")
    text = kwargs.pop("text", "Say hello") + " " + m
    r = chat(gw, text, **kwargs)
    assert r.status_code == 200, r.text
    assert r.headers["x-llmgw-tier"] == tier
    reason = r.headers["x-llmgw-route-reason"]
    assert reason == ("rule=%s" % rule if rule else "default")
    # the tier's backend answered: the stub saw its upstream model name
    seen = [x for x in stub.recorded() if m in json.dumps(x.get("body"))]
    assert len(seen) == 1 and seen[0]["body"]["model"] == "stub-" + tier


def test_tier_down_follows_the_fallback_chain(gw, stub):
    m = uniq("down")
    r = chat(gw, "hello " + m, model="flaky-model")
    assert r.status_code == 200, r.text
    assert r.headers["x-llmgw-tier"] == "small"
    seen = [x for x in stub.recorded() if m in json.dumps(x.get("body"))]
    assert len(seen) == 1 and seen[0]["body"]["model"] == "stub-small"
    assert metric_value(metrics(gw), "llmgw_fallbacks_total", **{"from": "dead", "to": "small"}) >= 1


def test_unrouted_model_names_keep_config_tiers(gw):
    r = chat(gw, "hello " + uniq("direct"), model="remote")
    assert r.status_code == 200 and r.headers["x-llmgw-tier"] == "remote"
    assert r.headers["x-llmgw-route-reason"] == "model"
    assert "x-llmgw-cost-usd" not in r.headers
    assert chat(gw, "hello", model="no-such-model").status_code == 404


def test_costs_in_headers_and_metrics(gw):
    before_cost = metric_sum(metrics(gw), "llmgw_cost_usd_total") or 0
    r = chat(gw, "How many moons does Mars have? " + uniq("cost"), model="gpt-4o-mini")
    assert r.status_code == 200
    usage = r.json()["usage"]
    pin, pout = PRICES["small"]
    rin, rout = PRICES["large"]
    cost = (usage["prompt_tokens"] * pin + usage["completion_tokens"] * pout) / 1e6
    ref = (usage["prompt_tokens"] * rin + usage["completion_tokens"] * rout) / 1e6
    assert float(r.headers["x-llmgw-cost-usd"]) == pytest.approx(cost, abs=1e-8)
    assert float(r.headers["x-llmgw-saved-usd"]) == pytest.approx(ref - cost, abs=1e-8)
    text = metrics(gw)
    assert metric_sum(text, "llmgw_cost_usd_total") == pytest.approx(before_cost + cost, abs=1e-8)
    assert metric_value(text, "llmgw_route_decisions_total", tier="small", rule="default") >= 1


def test_cache_hit_costs_nothing_and_saves(gw):
    q = "What is the chemical symbol for gold? " + uniq("cachecost")
    first = chat(gw, q, model="gpt-4o-mini", temperature=0)
    assert first.headers["x-llmgw-cache"] == "miss"
    second = chat(gw, q, model="gpt-4o-mini", temperature=0)
    assert second.headers["x-llmgw-cache"] == "exact"
    assert float(second.headers["x-llmgw-cost-usd"]) == 0
    u = first.json()["usage"]
    rin, rout = PRICES["large"]
    assert float(second.headers["x-llmgw-saved-usd"]) == pytest.approx(
        (u["prompt_tokens"] * rin + u["completion_tokens"] * rout) / 1e6, abs=1e-8)
    assert metric_value(metrics(gw), "llmgw_saved_usd_total", by="cache") > 0


def test_classifier_scores_auto_requests(gw):
    # Two MMLU-style questions the shipped classifier knows the like of: an easy marketing one
    # and a hard abstract-algebra one.
    easy = ("The term 'marketing mix' refers to\nA. the 4 Ps: product, price, place and promotion\n"
            "B. a blend of advertising media\nC. a mix of customers\nD. a sales forecast\nAnswer:")
    hard = ("Let p = (1, 2, 5, 4)(2, 3) in S_5. Find the index of <p> in S_5.\n"
            "A. 8\nB. 2\nC. 24\nD. 120\nAnswer:")
    decisions = {}
    for name, text in (("easy", easy), ("hard", hard)):
        d = dry(gw, text)
        assert d["score"] is not None and 0 <= d["score"] <= 1
        assert d["familiar"] is True
        assert d["tier"] == ("large" if d["score"] >= 0.5 else "small")
        r = chat(gw, text + " " + uniq("clf"))
        assert r.status_code == 200
        assert "score=" in r.headers["x-llmgw-route-reason"]
        decisions[name] = d["score"]
    assert decisions["hard"] > decisions["easy"]
    # Small talk is nothing like its training prompts: it says so, and /metrics counts it.
    before = metric_value(metrics(gw), "llmgw_route_scored_total", familiar="false") or 0
    assert dry(gw, "hi there")["familiar"] is False
    assert metric_value(metrics(gw), "llmgw_route_scored_total", familiar="false") == before + 1
    assert metric_value(metrics(gw), "llmgw_route_scored_total", familiar="true") >= 2


def test_unfamiliar_prompts_follow_route_unfamiliar_to(gw, policy_file):
    """With route_unfamiliar_to, the score rule sends prompts the classifier cannot judge to that
    tier whatever their score; familiar ones still route by score."""
    mmlu = ("The term 'marketing mix' refers to\nA. the 4 Ps: product, price, place and promotion\n"
            "B. a blend of advertising media\nC. a mix of customers\nD. a sales forecast\nAnswer:")
    try:
        policy_file.write_text(policy_yaml(BASE_RULES).replace(
            "reference_tier: large\n", "reference_tier: large\nroute_unfamiliar_to: dead\n"))
        wait_until(lambda: dry(gw, "hi there")["tier"] == "dead", 10,
                   what="the edited policy sends unfamiliar prompts to dead")
        d = dry(gw, "hi there")
        assert d["rule"] == "hard" and d["familiar"] is False and "unfamiliar" in d["reason"]
        d = dry(gw, mmlu)
        assert d["familiar"] is True and d["tier"] in ("small", "large")
        assert "unfamiliar" not in d["reason"]
        # Rules before the score rule still decide first.
        assert dry(gw, "hi there", model="gpt-4o")["tier"] == "large"
    finally:
        policy_file.write_text(policy_yaml(BASE_RULES))
        wait_until(lambda: dry(gw, "hi there")["tier"] != "dead", 10, what="the policy is restored")


def test_dry_run_does_not_call_the_tier(gw, stub):
    m = uniq("dry")
    d = dry(gw, "Explain quicksort " + m, model="gpt-4o")
    assert d["tier"] == "large" and d["rule"] == "pinned-large" and d["kind"] == "upstream"
    assert d["input_tokens_estimate"] > 0
    assert not [x for x in stub.recorded() if m in json.dumps(x.get("body"))]
    bad = requests.post(gw.http + "/v1/llmgw/route", headers={"Authorization": "Bearer sk-test-a"},
                        data="{not json", timeout=5)
    assert bad.status_code == 400


# ------------------------------------------------------------------------------------ reload

def wait_tier(gw, model, tier, timeout=10):
    wait_until(lambda: dry(gw, "hello there", model=model)["tier"] == tier, timeout,
               what="requests for %s route to %s" % (model, tier))


def test_reload_on_edit_and_broken_edit_keeps_old_policy(gw, policy_file):
    try:
        policy_file.write_text(policy_yaml(BASE_RULES, default="large"))
        wait_tier(gw, "gpt-4o-mini", "large")
        gen = metric_sum(metrics(gw), "llmgw_policy_generation")
        # a broken edit: an undefined tier
        policy_file.write_text(policy_yaml(BASE_RULES + "  - name: bad\n    match: {model: [x]}\n    tier: nope\n",
                                           default="small"))
        wait_until(lambda: requests.get(gw.http + "/readyz", timeout=5).json()["policy"]["error"], 10,
                   what="/readyz reports the broken policy")
        ready = requests.get(gw.http + "/readyz", timeout=5)
        assert ready.status_code == 200
        err = ready.json()["policy"]["error"]
        assert "policy.yaml:" in err and "nope" in err
        assert metric_sum(metrics(gw), "llmgw_policy_valid") == 0
        assert metric_sum(metrics(gw), "llmgw_policy_generation") == gen
        assert dry(gw, "hello", model="gpt-4o-mini")["tier"] == "large"   # the old policy serves
        # renamed over (how editors save): picked up too
        tmp = policy_file.with_suffix(".tmp")
        tmp.write_text(policy_yaml(BASE_RULES, default="small"))
        os.rename(tmp, policy_file)
        wait_tier(gw, "gpt-4o-mini", "small")
        assert requests.get(gw.http + "/readyz", timeout=5).json()["policy"]["error"] is None
        assert metric_sum(metrics(gw), "llmgw_policy_valid") == 1
    finally:
        policy_file.write_text(policy_yaml(BASE_RULES))
        wait_tier(gw, "gpt-4o-mini", "small")


def test_sighup_reloads(rdir, stub):
    pdir = rdir / "hup"
    pdir.mkdir()
    pf = pdir / "p.yaml"
    pf.write_text(policy_yaml(BASE_RULES))
    g = Gateway(rdir / "gw-hup", gw_config(stub, pf, cache=False), dev_tls=False).start()
    try:
        gen = metric_sum(metrics(g), "llmgw_policy_generation")
        g.signal(signal.SIGHUP)
        wait_until(lambda: metric_sum(metrics(g), "llmgw_policy_generation") == gen + 1, 5,
                   what="SIGHUP reloaded the policy")
    finally:
        assert g.stop() == 0


def test_reload_under_load(gw, policy_file):
    """The file is rewritten 30 times (every third edit broken) while requests run: none fails,
    and after each valid edit the decisions follow it."""
    failures, done, count = [], threading.Event(), [0]

    def load():
        while not done.is_set():
            try:
                r = chat(gw, "load " + uniq("reload"), model="gpt-4o-mini")
                if r.status_code != 200:
                    failures.append(r.status_code)
                count[0] += 1
            except Exception as e:  # noqa: BLE001
                failures.append(repr(e))

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for i in range(30):
            if i % 3 == 2:
                policy_file.write_text(policy_yaml(BASE_RULES) + "  - name: broken%d\n    match: {regex: ['(']}\n"
                                       "    tier: small\n" % i)
                time.sleep(0.3)
                continue
            want = "large" if i % 2 else "small"
            policy_file.write_text(policy_yaml(BASE_RULES, default=want))
            wait_tier(gw, "gpt-4o-mini", want)
    finally:
        done.set()
        for t in threads:
            t.join(30)
        policy_file.write_text(policy_yaml(BASE_RULES))
        wait_tier(gw, "gpt-4o-mini", "small")
    assert failures == [], failures[:5]
    assert count[0] > 30
    assert metric_value(metrics(gw), "llmgw_policy_reloads_total", result="error") >= 10


# ------------------------------------------------------------------------------------ capacity

def test_max_concurrent_falls_back(rdir, stub):
    pdir = rdir / "cap"
    pdir.mkdir()
    pf = pdir / "p.yaml"
    pf.write_text(policy_yaml(BASE_RULES, small_conc=1))
    g = Gateway(rdir / "gw-cap", gw_config(stub, pf, cache=False), dev_tls=False).start()
    try:
        slow = threading.Thread(target=chat, args=(g, "stub:sleep=1.5 " + uniq("cap")), kwargs={"model": "gpt-4o-mini"})
        slow.start()
        wait_until(lambda: metric_value(metrics(g), "llmgw_in_flight_requests") >= 1, 5, what="the slow call runs")
        time.sleep(0.2)
        r = chat(g, "quick one " + uniq("cap"), model="gpt-4o-mini")
        assert r.status_code == 200
        assert r.headers["x-llmgw-tier"] == "large"
        assert "fallback: small full" in r.headers["x-llmgw-route-reason"]
        slow.join(10)
        assert metric_value(metrics(g), "llmgw_tier_over_capacity_total", tier="small") == 1
    finally:
        assert g.stop() == 0


# ------------------------------------------------------------------------------------ CLI

def test_check_policy_cli(rdir):
    good = rdir / "good.yaml"
    good.write_text(policy_yaml(BASE_RULES))
    out = subprocess.run([str(LLMGW_BIN), "--check-policy", str(good)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    bad = rdir / "bad.yaml"
    bad.write_text(policy_yaml(BASE_RULES + "  - name: oops\n    match: {regex: ['([a-z']}\n    tier: small\n"))
    out = subprocess.run([str(LLMGW_BIN), "--check-policy", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "bad.yaml:" in out.stderr and "regex" in out.stderr.lower()
    shipped = subprocess.run([str(LLMGW_BIN), "--check-policy", str(ROOT / "policies" / "default.yaml"),
                              "-c", str(ROOT / "policies" / "llmgw.yaml")], capture_output=True, text=True)
    assert shipped.returncode == 0, shipped.stderr

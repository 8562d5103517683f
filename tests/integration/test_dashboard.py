"""The operator's view: GET /v1/llmgw/stats (admin key groups), GET /dashboard in a real headless
Chromium (Debian's chromium + chromium-driver, selenium from PyPI) showing the same numbers as
the stats endpoint after a short replayed load of real MMLU prompts, with a screenshot kept as a
test artifact; and /metrics clean under Prometheus' own linter (`promtool check metrics`).
Real llmgw and stub-upstream processes; the load goes through the official openai SDK."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import openai
import pytest
import requests

from llmgw_it import ROOT, Gateway, Stub, base_config, free_port, metric_sum, wait_until

ENCODER_DIR = Path(os.environ.get("LLMGW_ENCODER_MODEL") or ROOT / "models" / "all-MiniLM-L6-v2")
ARTIFACTS = Path(os.environ.get("LLMGW_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
PROMPTS = ROOT / "bench" / "replay" / "mmlu.jsonl"

POLICY = """version: 1
models: [auto, gpt-4o-mini, gpt-4o]
default_tier: small
reference_tier: large
tiers:
  small:
    price: {input_per_1m: 0.15, output_per_1m: 0.60}
    context: 8192
    fallback: [large]
  large:
    price: {input_per_1m: 2.50, output_per_1m: 10.00}
    context: 8192
rules:
  - name: pinned-large
    match: {model: [gpt-4o]}
    tier: large
"""


@pytest.fixture(scope="module")
def dash(tmp_path_factory):
    d = tmp_path_factory.mktemp("dashboard")
    stub = Stub(d, "dashstub", chunk_delay=0.001)
    policy = d / "policy.yaml"
    policy.write_text(POLICY)
    tiers = [
        {"name": "small", "kind": "upstream", "base_url": stub.base_url, "model": "stub-small"},
        {"name": "large", "kind": "upstream", "base_url": stub.base_url, "model": "stub-large"},
    ]
    keys = [{"key": "sk-test-a", "group": "team-a"}, {"key": "sk-test-ops", "group": "ops"}]
    cfg = base_config(free_port(), tiers=tiers, keys=keys,
                      limits={"request_timeout_ms": 30000, "read_timeout_ms": 30000})
    cfg["auth"]["admin_groups"] = ["ops"]
    cfg["encoder"] = {"model_dir": str(ENCODER_DIR), "threads": 1}
    cfg["cache"] = {"enabled": True, "threshold": 0.985}
    cfg["policy"] = str(policy)
    gw = Gateway(d / "gw", cfg, dev_tls=False).start()
    yield gw
    assert gw.stop() == 0, gw.log_tail()
    stub.stop()


def replay(gw, n=12):
    """n real MMLU prompts through the SDK, each twice (the second is a cache hit), some pinned
    to the large tier, one streamed."""
    client = openai.OpenAI(base_url=gw.http + "/v1", api_key="sk-test-a", max_retries=0)
    prompts = []
    with open(PROMPTS) as f:
        for line in f:
            msgs = json.loads(line)["request"]["messages"]
            prompts.append(msgs[-1]["content"])
            if len(prompts) == n:
                break
    for i, p in enumerate(prompts):
        model = "gpt-4o" if i % 4 == 0 else "gpt-4o-mini"
        for _ in range(2):
            client.chat.completions.create(model=model, temperature=0, max_tokens=16,
                                           messages=[{"role": "user", "content": p}])
    stream = client.chat.completions.create(model="gpt-4o-mini", temperature=0, stream=True,
                                            messages=[{"role": "user", "content": prompts[1]}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    client.close()


def stats(gw, key="sk-test-ops"):
    r = requests.get(gw.http + "/v1/llmgw/stats", headers={"Authorization": "Bearer " + key},
                     timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_stats_are_for_admin_groups_and_agree_with_metrics(dash):
    replay(dash)
    r = requests.get(dash.http + "/v1/llmgw/stats", timeout=10)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    r = requests.get(dash.http + "/v1/llmgw/stats", timeout=10,
                     headers={"Authorization": "Bearer sk-test-a"})
    assert r.status_code == 403 and "admin_groups" in r.json()["error"]["message"], r.text
    r = requests.post(dash.http + "/v1/llmgw/stats", timeout=10,
                      headers={"Authorization": "Bearer sk-ops"})
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    s = stats(dash)
    metrics = requests.get(dash.http + "/metrics", timeout=10).text
    assert s["object"] == "llmgw.stats" and s["now"] >= s["started_at"]
    assert s["totals"]["spent_usd"] == pytest.approx(metric_sum(metrics, "llmgw_cost_usd_total"))
    assert s["totals"]["saved_usd"] == pytest.approx(metric_sum(metrics, "llmgw_saved_usd_total"))
    assert s["totals"]["requests"] == 25      # 12 x 2 + 1 streamed; not the operator's own
    assert s["totals"]["errors"] == 0
    assert s["saved_usd"]["cache"] > 0 and s["saved_usd"]["routing"] > 0
    assert s["cache"]["hits"] >= 12 and 0 < s["cache"]["hit_rate"] <= 1
    tiers = {t["name"]: t for t in s["tiers"]}
    assert set(tiers) == {"small", "large"}
    assert tiers["large"]["requests"] > 0 and tiers["small"]["requests"] > 0
    for t in tiers.values():
        lat = t["latency_seconds"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"], t
        assert t["spent_usd"] > 0 and t["tokens_completion"] > 0
    assert s["policy"]["generation"] >= 1 and s["policy"]["error"] is None
    assert s["engine"] is None   # no engine tier here


def test_metrics_pass_promtool(dash):
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found (scripts/setup installs Debian's prometheus package)"
    text = requests.get(dash.http + "/metrics", timeout=10).text
    assert "llmgw_tier_request_duration_seconds_bucket" in text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), p.stdout + p.stderr


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1400,1000"):
        opts.add_argument(a)
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert binary and driver, "chromium / chromedriver not found (scripts/setup installs them)"
    opts.binary_location = binary
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_dashboard_shows_the_stats_in_a_real_browser(dash):
    from selenium.webdriver.common.by import By
    replay(dash, n=4)
    r = requests.get(dash.http + "/dashboard", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    page = r.text.replace("http://www.w3.org/2000/svg", "")   # SVG's namespace, not a load
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    d = browser()
    try:
        d.get(dash.http + "/dashboard")
        d.find_element(By.ID, "key").send_keys("sk-test-ops")
        d.find_element(By.CSS_SELECTOR, "#login button").click()
        # two polls, so that rates and the table are filled in
        wait_until(lambda: d.find_element(By.ID, "status").get_attribute("data-now"), 20)
        first = d.find_element(By.ID, "status").get_attribute("data-now")
        wait_until(lambda: d.find_element(By.ID, "status").get_attribute("data-now") != first, 20)
        s = stats(dash)   # nothing else runs: the page's numbers are the endpoint's

        def shown(el_id):
            return d.find_element(By.ID, el_id).get_attribute("data-value")

        t = s["totals"]
        assert float(shown("spent_usd")) == pytest.approx(t["spent_usd"], rel=1e-12)
        assert float(shown("saved_usd")) == pytest.approx(t["saved_usd"], rel=1e-12)
        assert d.find_element(By.ID, "spent_usd").text == "$%.6f" % t["spent_usd"]
        assert float(shown("requests")) == t["requests"]
        assert float(shown("errors")) == t["errors"]
        assert float(shown("hit_rate")) == pytest.approx(s["cache"]["hit_rate"], rel=1e-12)
        assert float(shown("cache_hits")) == s["cache"]["hits"]
        assert d.find_element(By.ID, "policy_result").text == "ok"
        rows = d.find_elements(By.CSS_SELECTOR, "#tiers tr")
        assert [r.get_attribute("data-tier") for r in rows] == [x["name"] for x in s["tiers"]]
        for row, tier in zip(rows, s["tiers"]):
            cells = {c.get_attribute("data-stat"): c.get_attribute("data-value")
                     for c in row.find_elements(By.TAG_NAME, "td")}
            assert float(cells["requests"]) == tier["requests"]
            assert float(cells["spent_usd"]) == pytest.approx(tier["spent_usd"], rel=1e-12)
            assert float(cells["p50"]) == pytest.approx(tier["latency_seconds"]["p50"], rel=1e-12)
            assert float(cells["p99"]) == pytest.approx(tier["latency_seconds"]["p99"], rel=1e-12)
            assert float(cells["tokens_completion"]) == tier["tokens_completion"]
        logs = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
        assert not logs, logs   # no script errors, no blocked external loads
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10000
    finally:
        d.quit()


def test_dashboard_with_a_wrong_key_says_so(dash):
    from selenium.webdriver.common.by import By
    d = browser()
    try:
        d.get(dash.http + "/dashboard")
        d.find_element(By.ID, "key").send_keys("sk-test-a")
        d.find_element(By.CSS_SELECTOR, "#login button").click()
        wait_until(lambda: "admin_groups" in d.find_element(By.ID, "status").text, 20)
        assert d.find_element(By.ID, "spent_usd").text == "–"
    finally:
        d.quit()


def test_grafana_dashboard_uses_exported_names(dash):
    """docker/grafana-dashboard.json: valid JSON, and every llmgw_* series its PromQL reads is a
    family /metrics declares (a _bucket of a histogram included)."""
    import re
    d = json.loads((ROOT / "docker" / "grafana-dashboard.json").read_text())
    text = requests.get(dash.http + "/metrics", timeout=10).text
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    assert len(exprs) >= 12
    for e in exprs:
        for name in re.findall(r"\bllmgw_[a-z0-9_]+", e):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in types or types.get(base) == "histogram", (name, e)

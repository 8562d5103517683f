"""The small-first cascade end to end (policies/README.md: cascade): a policy rule sends
requests to the `large` engine tier (the F16 stand-in, drafting with tier `small`'s Q4_1 model)
with a cascade; the small model answers first and the large one comes in only when the deferral
rule says so. Checked with the openai SDK against the tiers answering alone: an answer that did
not escalate is the small tier's, one that escalated before any token was released is the large
tier's; a stream's text is the whole answer's (nothing sent is taken back); headers, costs and
/metrics report what happened. Kernels are batch-invariant (LLMGW_KERNELS=invariant), so a
verification forward computes what plain decoding does."""
import openai
import pytest
import requests

from llmgw_it import ROOT, Gateway, engine_config, engine_tier, free_port, metric_value, wait_until

F16 = ROOT / "models" / "SmolLM2-135M-Instruct.F16.gguf"
PRICE_SMALL = (0.1, 0.4)
PRICE_LARGE = (2.0, 8.0)

POLICY = """\
models: [auto]
default_tier: large
tiers:
  small: {price: {input_per_1m: %g, output_per_1m: %g}}
  large: {price: {input_per_1m: %g, output_per_1m: %g}}
rules:
  - name: keep
    match: {keywords: [KEEP]}
    tier: large
    cascade: {enabled: true, threshold: 0.000001}
  - name: escalate
    match: {keywords: [ESCALATE]}
    tier: large
    cascade: {enabled: true, threshold: 1, window: 2, hold: 4}
  - name: diff-never
    match: {keywords: [DIFFNEVER]}
    tier: large
    cascade: {enabled: true, rule: diff, threshold: 1, window: 2, margin: 1, hold: 4}
""" % (PRICE_SMALL + PRICE_LARGE)


@pytest.fixture(scope="module")
def cgw(tmp_path_factory, engine_model):
    if not F16.is_file():
        pytest.fail("the F16 stand-in is missing: run scripts/make-standin", pytrace=False)
    d = tmp_path_factory.mktemp("cascade")
    (d / "policy.yaml").write_text(POLICY)
    cfg = engine_config(free_port(), [
        engine_tier("small", engine_model, threads=1, aliases=(), context=512),
        engine_tier("large", F16, threads=1, aliases=(), context=512, draft_tier="small",
                    draft_always=True, draft_max=4),
    ])
    cfg["policy"] = str(d / "policy.yaml")
    gw = Gateway(d / "gw", cfg, dev_tls=False, env={"LLMGW_KERNELS": "invariant"}).start()
    yield gw
    assert gw.stop() == 0, gw.log_tail()


def client(gw):
    return openai.OpenAI(base_url=gw.http + "/v1", api_key="sk-test-a", max_retries=0, timeout=120)


def ask(gw, model, text, max_tokens=20, stream=False):
    c = client(gw)
    msgs = [{"role": "user", "content": text}]
    if stream:
        s = c.chat.completions.create(model=model, messages=msgs, max_tokens=max_tokens,
                                      temperature=0, stream=True)
        return "".join(ch.choices[0].delta.content or "" for ch in s if ch.choices)
    raw = c.chat.completions.with_raw_response.create(model=model, messages=msgs,
                                                      max_tokens=max_tokens, temperature=0)
    return raw.parse(), raw.headers


def cost(price, tokens_in, tokens_out):
    return (price[0] * tokens_in + price[1] * tokens_out) / 1e6


QUESTIONS = ["Name three rivers in Europe. %s", "What is 12 times 7? %s",
             "Write a haiku about the sea. %s"]


@pytest.mark.parametrize("q", QUESTIONS)
def test_not_escalated_is_the_small_tiers_answer(cgw, q):
    got, h = ask(cgw, "auto", q % "KEEP")
    want, _ = ask(cgw, "small", q % "KEEP")
    assert h["x-llmgw-tier"] == "large"
    assert h["x-llmgw-cascade"] == "small"
    assert got.choices[0].message.content == want.choices[0].message.content
    u = got.usage
    assert int(h["x-llmgw-cascade-kept-tokens"]) == u.completion_tokens
    assert int(h["x-llmgw-cascade-small-tokens"]) == u.completion_tokens
    assert int(h["x-llmgw-cascade-large-tokens"]) == 0
    # Only the small model worked: its prices, for the prompt and its tokens.
    assert float(h["x-llmgw-cost-usd"]) == pytest.approx(
        cost(PRICE_SMALL, u.prompt_tokens, u.completion_tokens), abs=1e-8)
    assert float(h["x-llmgw-saved-usd"]) == pytest.approx(
        cost(PRICE_LARGE, u.prompt_tokens, u.completion_tokens) -
        cost(PRICE_SMALL, u.prompt_tokens, u.completion_tokens), abs=1e-8)


@pytest.mark.parametrize("q", QUESTIONS)
def test_escalated_is_the_large_tiers_answer(cgw, q):
    got, h = ask(cgw, "auto", q % "ESCALATE")
    want, _ = ask(cgw, "large", q % "ESCALATE")
    assert h["x-llmgw-cascade"] == "escalated"
    assert got.choices[0].message.content == want.choices[0].message.content
    kept = int(h["x-llmgw-cascade-kept-tokens"])
    small = int(h["x-llmgw-cascade-small-tokens"])
    assert 0 <= kept <= min(small, got.usage.completion_tokens)
    # The large model computed at least the positions of its own tokens (the prompt's may
    # come from shared prefix pages).
    assert int(h["x-llmgw-cascade-large-tokens"]) >= got.usage.completion_tokens - kept
    assert float(h["x-llmgw-cost-usd"]) > cost(PRICE_SMALL, got.usage.prompt_tokens, 0)
    # The stream sends the same text: held tokens are verified before they leave.
    assert ask(cgw, "auto", q % "ESCALATE", stream=True) == got.choices[0].message.content


def test_diff_that_never_defers_keeps_the_small_answer(cgw):
    def checks():
        text = requests.get(cgw.http + "/metrics", timeout=5).text
        return metric_value(text, "llmgw_engine_cascade_checks_total", tier="large") or 0
    before = checks()
    got, h = ask(cgw, "auto", QUESTIONS[0] % "DIFFNEVER")
    want, _ = ask(cgw, "small", QUESTIONS[0] % "DIFFNEVER")
    assert h["x-llmgw-cascade"] == "small"
    assert got.choices[0].message.content == want.choices[0].message.content
    # The large model checked (threshold 1: after every window) and computed for it.
    assert checks() > before
    assert int(h["x-llmgw-cascade-large-tokens"]) > 0


def test_cascade_metrics(cgw):
    ask(cgw, "auto", "Hello KEEP", max_tokens=4)
    ask(cgw, "auto", "Hello ESCALATE", max_tokens=4)
    def m(name, **labels):
        return metric_value(requests.get(cgw.http + "/metrics", timeout=5).text, name, **labels) or 0
    wait_until(lambda: m("llmgw_cascade_requests_total", outcome="escalated") > 0, 10,
               what="escalations in /metrics")
    assert m("llmgw_cascade_requests_total", tier="large", rule="chow", outcome="small") > 0
    assert m("llmgw_cascade_small_tokens_total", tier="large") >= \
        m("llmgw_cascade_kept_tokens_total", tier="large") > 0
    assert m("llmgw_cost_usd_total", tier="small") > 0
    assert m("llmgw_cost_usd_total", tier="large") > 0

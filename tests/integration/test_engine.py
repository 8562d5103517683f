"""Engine tiers: a GGUF model (SmolLM2-135M-Instruct Q4_1) served in-process by llmgw.

The client is the official openai SDK. Generations are kept short (max_tokens <= 32, the model
does ~30-200 tokens/s on these CPUs); the tests that need long output (disconnect) cancel it.
Greedy decoding (temperature 0) is deterministic, and so is seeded sampling: most checks
compare two generations that must be identical, byte for byte.
"""

import math
import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from llmgw_it import (LLMGW_BIN, engine_config, engine_tier, free_port, metric_sum, metric_value, to_yaml,
                      wait_until)

AUTH = {"Authorization": "Bearer sk-test-a"}
TIER = "small"

STORY = [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
ESSAY = [{"role": "user", "content": "Write a long essay about the history of Rome."}]
TOPICS = ["a cat", "the ocean", "a mountain village", "a busy train station", "an old library",
          "a desert at night", "a rainy city street", "a winter forest"]


def msgs(user, system="You are a helpful assistant."):
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def greedy(client, messages, max_tokens=24, **kw):
    return client.chat.completions.create(model=TIER, messages=messages, max_tokens=max_tokens,
                                          temperature=0, **kw)


def stream_chat(client, messages, **kw):
    """Streams a chat completion; returns (content pieces, finish reasons, usage, logprob entries,
    roles, arrival times of the content pieces)."""
    pieces, finish, usage, lps, roles, arrivals = [], [], None, [], [], []
    for chunk in client.chat.completions.create(model=TIER, messages=messages, stream=True, **kw):
        if chunk.usage is not None:
            assert not chunk.choices, "the usage chunk must have empty choices: %r" % chunk
            usage = chunk.usage
        for ch in chunk.choices:
            assert ch.index == 0
            if ch.delta.role:
                roles.append(ch.delta.role)
            if ch.delta.content:
                pieces.append(ch.delta.content)
                arrivals.append(time.monotonic())
            if ch.logprobs is not None and ch.logprobs.content:
                lps.extend(ch.logprobs.content)
            if ch.finish_reason:
                finish.append(ch.finish_reason)
    return pieces, finish, usage, lps, roles, arrivals


def metrics(gw):
    r = requests.get(gw.http + "/metrics", headers=AUTH, timeout=5)
    assert r.status_code == 200
    return r.text


def engine_state(gw):
    t = metrics(gw)
    return {"running": metric_value(t, "llmgw_engine_sequences", tier=TIER, state="running"),
            "waiting": metric_value(t, "llmgw_engine_sequences", tier=TIER, state="waiting"),
            # pages held only by the tiers' shared-prefix tables are not in use by any request
            "kv_used": metric_value(t, "llmgw_kv_pages", state="used")
            - (metric_sum(t, "llmgw_engine_prefix_pages") or 0),
            "kv_total": metric_value(t, "llmgw_kv_pages", state="total"),
            "prefill": metric_value(t, "llmgw_engine_tokens_total", tier=TIER, phase="prefill"),
            "decode": metric_value(t, "llmgw_engine_tokens_total", tier=TIER, phase="decode"),
            "steps": metric_value(t, "llmgw_engine_steps_total", tier=TIER),
            "prefix_hits": metric_value(t, "llmgw_engine_prefix_hit_tokens_total", tier=TIER) or 0,
            "preemptions": metric_value(t, "llmgw_engine_preemptions_total", tier=TIER)}


def wait_idle(gw, timeout=10):
    """Waits until no sequence runs or waits and every KV page is back in the pool (or held by a
    prefix table only)."""
    return wait_until(lambda: (lambda s: s if (s["running"], s["waiting"], s["kv_used"]) == (0, 0, 0) else None)(
        engine_state(gw)), timeout=timeout, interval=0.05, what="engine idle (running=waiting=0, kv used=0)")


# ------------------------------------------------------------------ shapes and basics

def test_engine_chat_completion_shape(engine_gateway, engine_client):
    raw = engine_client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=STORY, max_tokens=16, temperature=0)
    assert raw.headers.get("x-llmgw-tier") == TIER
    assert raw.headers.get("x-request-id")
    c = raw.parse()
    assert c.object == "chat.completion"
    assert c.id.startswith("chatcmpl-")
    assert c.model == "gpt-4o-mini"
    assert abs(c.created - time.time()) < 120
    assert len(c.choices) == 1
    ch = c.choices[0]
    assert ch.index == 0 and ch.message.role == "assistant"
    assert isinstance(ch.message.content, str) and ch.message.content.strip()
    assert ch.logprobs is None, "logprobs were not asked for"
    assert ch.finish_reason in ("stop", "length")
    u = c.usage
    assert u.prompt_tokens > 10 and 1 <= u.completion_tokens <= 16
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    if ch.finish_reason == "length":
        assert u.completion_tokens == 16


def test_greedy_is_deterministic_and_stream_equals_non_stream(engine_client):
    a = greedy(engine_client, STORY, max_tokens=24)
    b = greedy(engine_client, STORY, max_tokens=24)
    text = a.choices[0].message.content
    assert text, "empty greedy output"
    assert b.choices[0].message.content == text, "greedy output differs between two identical calls"
    assert a.choices[0].finish_reason == b.choices[0].finish_reason
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (b.usage.prompt_tokens, b.usage.completion_tokens)

    pieces, finish, usage, _, roles, _ = stream_chat(engine_client, STORY, max_tokens=24, temperature=0,
                                                     stream_options={"include_usage": True})
    assert "".join(pieces) == text, "stream and non-stream greedy outputs differ"
    assert roles == ["assistant"]
    assert finish == [a.choices[0].finish_reason]
    assert usage is not None, "no usage chunk although stream_options.include_usage was set"
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == \
        (a.usage.prompt_tokens, a.usage.completion_tokens, a.usage.total_tokens)


def test_stream_without_include_usage_has_no_usage(engine_client):
    chunks = list(engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=4,
                                                        temperature=0, stream=True))
    assert chunks and all(c.usage is None for c in chunks)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]


def test_max_tokens_gives_length_and_usage_counts_stream_tokens(engine_client):
    n = 20
    c = greedy(engine_client, ESSAY, max_tokens=n)
    assert c.choices[0].finish_reason == "length"
    assert c.usage.completion_tokens == n

    # one SSE chunk per generated token (plain English text: every token releases text)
    pieces, finish, usage, lps, _, _ = stream_chat(engine_client, ESSAY, max_tokens=n, temperature=0,
                                                   stream_options={"include_usage": True})
    assert finish == ["length"]
    assert usage.completion_tokens == n == len(pieces), \
        "completion_tokens=%d, streamed content chunks=%d, max_tokens=%d" % (usage.completion_tokens, len(pieces), n)
    assert usage.prompt_tokens == c.usage.prompt_tokens
    assert "".join(pieces) == c.choices[0].message.content

    # with logprobs every token is accounted for, whether or not it released text
    _, finish, usage, lps, _, _ = stream_chat(engine_client, ESSAY, max_tokens=n, temperature=0, logprobs=True,
                                              stream_options={"include_usage": True})
    assert finish == ["length"] and len(lps) == usage.completion_tokens == n

    # max_completion_tokens is the newer name of the same limit
    c = engine_client.chat.completions.create(model=TIER, messages=ESSAY, max_completion_tokens=5, temperature=0)
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 5


def test_prompt_tokens_depend_only_on_the_messages(engine_client):
    a = greedy(engine_client, msgs("Name three colors."), max_tokens=2)
    b = greedy(engine_client, msgs("Name three colors."), max_tokens=7)
    c = engine_client.chat.completions.create(model=TIER, messages=msgs("Name three colors."), max_tokens=3,
                                              temperature=0.9, seed=5)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens == c.usage.prompt_tokens
    longer = greedy(engine_client, msgs("Name three colors, then three animals, then three fruits."), max_tokens=2)
    assert longer.usage.prompt_tokens > a.usage.prompt_tokens


def test_chatml_template(engine_client):
    """A chat request is the ChatML rendering of its messages: /v1/completions with that text
    as the prompt gives the same prompt token count and the same greedy output."""
    conv = [{"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"}]
    chat = greedy(engine_client, conv, max_tokens=12)
    rendered = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in conv)
    rendered += "<|im_start|>assistant\n"
    comp = engine_client.completions.create(model=TIER, prompt=rendered, max_tokens=12, temperature=0)
    assert comp.usage.prompt_tokens == chat.usage.prompt_tokens, \
        "chat prompt is not the ChatML rendering of the messages (token counts %d vs %d)" % (
            chat.usage.prompt_tokens, comp.usage.prompt_tokens)
    assert comp.choices[0].text == chat.choices[0].message.content
    assert comp.choices[0].finish_reason == chat.choices[0].finish_reason
    assert "<|im_end|>" not in chat.choices[0].message.content and "<|im_start|>" not in chat.choices[0].message.content

    # the "developer" role is the system role of newer models
    dev = greedy(engine_client, [dict(conv[0], role="developer")] + conv[1:], max_tokens=12)
    assert dev.usage.prompt_tokens == chat.usage.prompt_tokens
    assert dev.choices[0].message.content == chat.choices[0].message.content


def test_completions_endpoint(engine_client):
    prompt = "The three primary colors are"
    c = engine_client.completions.create(model=TIER, prompt=prompt, max_tokens=10, temperature=0)
    assert c.object == "text_completion" and c.id.startswith("cmpl-")
    ch = c.choices[0]
    assert ch.index == 0 and isinstance(ch.text, str) and ch.text
    assert ch.finish_reason in ("stop", "length")
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    if ch.finish_reason == "length":
        assert c.usage.completion_tokens == 10

    text, finish, usage = [], [], None
    for chunk in engine_client.completions.create(model=TIER, prompt=prompt, max_tokens=10, temperature=0,
                                                  stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for cc in chunk.choices:
            text.append(cc.text)
            if cc.finish_reason:
                finish.append(cc.finish_reason)
    assert "".join(text) == ch.text
    assert finish == [ch.finish_reason]
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == \
        (c.usage.prompt_tokens, c.usage.completion_tokens)

    # OpenAI's default max_tokens for /v1/completions is 16
    d = engine_client.completions.create(model=TIER, prompt="Once upon a time", temperature=0)
    assert d.usage.completion_tokens <= 16
    if d.choices[0].finish_reason == "length":
        assert d.usage.completion_tokens == 16


# ------------------------------------------------------------------ sampling

def test_seeded_sampling_is_reproducible(engine_client):
    def sample(seed, **kw):
        c = engine_client.chat.completions.create(model=TIER, messages=msgs("Invent a name for a new planet and "
                                                                            "describe it."),
                                                  max_tokens=16, temperature=0.8, seed=seed, **kw)
        return c.choices[0].message.content

    first = sample(1234)
    assert first == sample(1234), "same seed, same temperature: the text must repeat"
    # another seed very likely draws another text (three tries, stopping at the first that differs)
    assert any(sample(s) != first for s in (1, 2, 3)), "three other seeds all gave exactly the seed-1234 text: %r" % first

    # the seeded stream draws the same tokens as the seeded non-stream request
    pieces, _, _, _, _, _ = stream_chat(engine_client, msgs("Invent a name for a new planet and describe it."),
                                        max_tokens=16, temperature=0.8, seed=1234)
    assert "".join(pieces) == first


def test_truncation_parameters_reduce_to_greedy(engine_client):
    """top_k=1, min_p=1 and a tiny top_p keep only the most likely token: sampling at
    temperature 1 must then give the greedy text whatever the seed."""
    want = greedy(engine_client, STORY, max_tokens=12).choices[0].message.content
    for seed, kw in ((7, {"extra_body": {"top_k": 1}}), (8, {"extra_body": {"min_p": 1.0}}), (9, {"top_p": 1e-6})):
        c = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=12, temperature=1.0,
                                                  seed=seed, **kw)
        assert c.choices[0].message.content == want, "%r seed=%d: sampled text is not the greedy one" % (kw, seed)


# ------------------------------------------------------------------ logprobs

def _check_entry(e, k, greedy_pick):
    assert isinstance(e.token, str)
    assert isinstance(e.logprob, float) and e.logprob <= 0 and math.isfinite(e.logprob)
    assert isinstance(e.bytes, list) and all(isinstance(x, int) and 0 <= x <= 255 for x in e.bytes)
    if "\ufffd" not in e.token:
        assert bytes(e.bytes) == e.token.encode("utf-8"), "bytes %r do not spell token %r" % (e.bytes, e.token)
    top = e.top_logprobs
    assert len(top) == k, "top_logprobs has %d entries, %d requested" % (len(top), k)
    vals = [t.logprob for t in top]
    assert vals == sorted(vals, reverse=True), "top_logprobs not sorted: %r" % vals
    assert all(v <= 0 and math.isfinite(v) for v in vals)
    assert sum(math.exp(v) for v in vals) <= 1 + 1e-4
    assert len({t.token for t in top}) == k or len({bytes(t.bytes) for t in top}) == k
    for t in top:
        assert isinstance(t.bytes, list)
        if "\ufffd" not in t.token:
            assert bytes(t.bytes) == t.token.encode("utf-8")
    if k > 0 and greedy_pick:
        assert (top[0].token, top[0].bytes) == (e.token, e.bytes), "greedy pick is not the most likely token"
        assert e.logprob == pytest.approx(top[0].logprob, abs=1e-6)
        assert any(t.token == e.token and t.logprob == pytest.approx(e.logprob, abs=1e-6) for t in top)


def test_logprobs(engine_client):
    k = 3
    c = greedy(engine_client, STORY, max_tokens=12, logprobs=True, top_logprobs=k)
    ch = c.choices[0]
    assert ch.logprobs is not None and ch.logprobs.content is not None
    entries = ch.logprobs.content
    assert len(entries) == c.usage.completion_tokens
    for e in entries:
        _check_entry(e, k, greedy_pick=True)
    joined = b"".join(bytes(e.bytes) for e in entries).decode("utf-8", errors="replace")
    assert joined == ch.message.content, "the tokens' bytes do not spell the content"

    # the stream carries the same entries, one per token
    pieces, _, _, lps, _, _ = stream_chat(engine_client, STORY, max_tokens=12, temperature=0, logprobs=True,
                                          top_logprobs=k)
    assert "".join(pieces) == ch.message.content
    assert [(e.token, e.bytes) for e in lps] == [(e.token, e.bytes) for e in entries]
    assert [e.logprob for e in lps] == pytest.approx([e.logprob for e in entries], abs=1e-6)
    assert [[t.token for t in e.top_logprobs] for e in lps] == [[t.token for t in e.top_logprobs] for e in entries]

    # logprobs without top_logprobs: entries with an empty top list
    c0 = greedy(engine_client, STORY, max_tokens=4, logprobs=True)
    assert len(c0.choices[0].logprobs.content) == c0.usage.completion_tokens
    for e in c0.choices[0].logprobs.content:
        _check_entry(e, 0, greedy_pick=True)

    # sampled tokens: logprob <= 0, and the chosen one is in the top list when its logprob is high enough
    s = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=12, temperature=0.9, seed=3,
                                              logprobs=True, top_logprobs=5)
    for e in s.choices[0].logprobs.content:
        _check_entry(e, 5, greedy_pick=False)
        if e.logprob > e.top_logprobs[-1].logprob + 1e-6:
            assert any(t.token == e.token for t in e.top_logprobs), "a token likelier than the 5th is not in the top 5"


# ------------------------------------------------------------------ stop strings

def _middle_words(text):
    """A two-word substring of text from its middle (after the first quarter)."""
    words = list(re.finditer(r"[A-Za-z]{3,}", text))
    assert len(words) >= 6, "greedy output too short to pick a stop string from: %r" % text
    mid = len(words) // 2
    a, b = words[mid], words[mid + 1]
    return text[a.start():b.end()]


def test_stop_string(engine_client):
    full = greedy(engine_client, STORY, max_tokens=32).choices[0].message.content
    stop = _middle_words(full)
    want = full[:full.index(stop)]
    assert want, "stop string %r at the start of %r" % (stop, full)

    c = greedy(engine_client, STORY, max_tokens=32, stop=[stop, "zqxv-never-generated"])
    got = c.choices[0].message.content
    assert c.choices[0].finish_reason == "stop", "stop=%r: finish_reason=%r, text=%r" % (
        stop, c.choices[0].finish_reason, got)
    assert got == want, "stop=%r: got %r, want %r (full greedy text %r)" % (stop, got, want, full)
    assert stop not in got

    pieces, finish, usage, _, _, _ = stream_chat(engine_client, STORY, max_tokens=32, temperature=0, stop=stop,
                                                 stream_options={"include_usage": True})
    assert "".join(pieces) == want, "streamed text with stop=%r: %r" % (stop, "".join(pieces))
    assert finish == ["stop"]
    assert usage.completion_tokens == c.usage.completion_tokens

    # one word only, four stop strings (the maximum), the first one to appear wins
    word = re.findall(r"[A-Za-z]{4,}", full)[-1]
    first_hit = min(full.index(s) for s in (stop, word))
    c = greedy(engine_client, STORY, max_tokens=32, stop=["zqxv1", word, "zqxv2", stop])
    assert c.choices[0].message.content == full[:first_hit]
    assert c.choices[0].finish_reason == "stop"

    # a stop string that never appears changes nothing
    c = greedy(engine_client, STORY, max_tokens=32, stop="zqxv-never-generated")
    assert c.choices[0].message.content == full


def test_stop_string_on_completions(engine_client):
    prompt = "Here is a list of fruits: apple, banana,"
    full = engine_client.completions.create(model=TIER, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    m = [x for x in re.finditer(r",", full)]
    assert len(m) >= 2, "expected a comma-separated list, got %r" % full
    c = engine_client.completions.create(model=TIER, prompt=prompt, max_tokens=24, temperature=0, stop=[","])
    assert c.choices[0].text == full[:full.index(",")]
    assert c.choices[0].finish_reason == "stop"


def test_too_many_stop_strings_is_400(engine_client):
    with pytest.raises(openai.BadRequestError) as ei:
        greedy(engine_client, STORY, max_tokens=4, stop=["a", "b", "c", "d", "e"])
    assert ei.value.status_code == 400 and ei.value.body.get("param") == "stop"


# ------------------------------------------------------------------ errors

def test_prompt_longer_than_context_is_400(engine_gateway, engine_client):
    long_text = "word " * 3000  # > 2048 tokens
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(model=TIER, messages=[{"role": "user", "content": long_text}],
                                              max_tokens=4)
    assert ei.value.status_code == 400
    assert ei.value.code == "context_length_exceeded", ei.value.body
    assert "2048" in ei.value.message
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.chat.completions.create(model=TIER, messages=[{"role": "user", "content": long_text}],
                                              max_tokens=4, stream=True)
    assert ei.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as ei:
        engine_client.completions.create(model=TIER, prompt=long_text, max_tokens=4)
    assert ei.value.code == "context_length_exceeded"
    # nothing was left behind, and the tier still answers
    wait_idle(engine_gateway)
    assert greedy(engine_client, STORY, max_tokens=2).usage.completion_tokens == 2


@pytest.mark.parametrize("case", ["n", "embeddings"])
def test_unsupported_features_are_400(engine_client, case):
    with pytest.raises(openai.BadRequestError) as ei:
        if case == "n":
            engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=4, n=17)
        else:
            engine_client.embeddings.create(model=TIER, input="hello")
    assert ei.value.status_code == 400
    body = ei.value.body
    assert isinstance(body, dict) and body.get("type") == "invalid_request_error" and body.get("message")
    assert body.get("param") == {"n": "n", "embeddings": "model"}[case]


# ------------------------------------------------------------------ streaming and batching

def test_stream_is_incremental(engine_client):
    t0 = time.monotonic()
    pieces, finish, usage, _, _, arrivals = stream_chat(engine_client, ESSAY, max_tokens=32, temperature=0,
                                                        stream_options={"include_usage": True})
    total = time.monotonic() - t0
    assert finish == ["length"] and len(pieces) == 32
    spread = arrivals[-1] - arrivals[0]
    groups = 1 + sum(1 for a, b in zip(arrivals, arrivals[1:]) if b - a > 0.002)
    assert spread > 0.3 * total and groups >= 8, \
        "tokens were not delivered as they were generated: %d pieces in %d bursts, first-to-last %.3fs of %.3fs" % (
            len(pieces), groups, spread, total)
    assert arrivals[0] - t0 < 0.7 * total


def test_concurrent_streams_match_solo_runs(engine_gateway, engine_client):
    """8 streams at once (continuous batching) give each the text it gets alone (greedy)."""
    convs = [msgs("Describe %s in a few sentences." % t) for t in TOPICS]
    solo = [greedy(engine_client, m, max_tokens=24) for m in convs]
    before = engine_state(engine_gateway)
    barrier = threading.Barrier(len(convs))

    def one(m):
        barrier.wait(10)
        return stream_chat(engine_client, m, max_tokens=24, temperature=0, stream_options={"include_usage": True})

    with ThreadPoolExecutor(len(convs)) as ex:
        results = list(ex.map(one, convs))
    after = engine_state(engine_gateway)
    for topic, s, (pieces, finish, usage, _, _, _) in zip(TOPICS, solo, results):
        assert "".join(pieces) == s.choices[0].message.content, "topic %r: batched text differs from solo" % topic
        assert finish == [s.choices[0].finish_reason]
        assert (usage.prompt_tokens, usage.completion_tokens) == (s.usage.prompt_tokens, s.usage.completion_tokens)
    tokens = sum(s.usage.completion_tokens for s in solo)
    steps = after["steps"] - before["steps"]
    # one at a time that is one forward step per token; batched, far fewer
    assert steps < 0.6 * tokens, "%d forward steps for %d tokens of 8 concurrent streams: not batched" % (steps, tokens)
    assert after["preemptions"] == before["preemptions"] == 0
    wait_idle(engine_gateway)


def test_engine_token_metrics(engine_gateway, engine_client):
    before = engine_state(engine_gateway)
    c = greedy(engine_client, STORY, max_tokens=10)
    after = wait_idle(engine_gateway)
    # every prompt token is either computed (prefill) or taken from shared prefix pages
    assert (after["prefill"] - before["prefill"]) + (after["prefix_hits"] - before["prefix_hits"]) == \
        c.usage.prompt_tokens
    # the first token comes from the prefill step; each later one is one decode token
    assert after["decode"] - before["decode"] in (c.usage.completion_tokens - 1, c.usage.completion_tokens)
    assert after["steps"] - before["steps"] >= c.usage.completion_tokens
    assert after["kv_total"] == 256 * 1024 // 256
    t = metrics(engine_gateway)
    for name in ("llmgw_engine_tokens_total", "llmgw_engine_steps_total", "llmgw_engine_preemptions_total",
                 "llmgw_engine_sequences", "llmgw_kv_pages"):
        assert "# TYPE %s " % name in t, "%s is not declared in /metrics" % name


# ------------------------------------------------------------------ cancellation

def test_client_disconnect_cancels_the_stream(engine_gateway, engine_client):
    wait_idle(engine_gateway)
    before = engine_state(engine_gateway)
    stream = engine_client.chat.completions.create(model=TIER, messages=ESSAY, max_tokens=1000, temperature=0,
                                                   stream=True)
    got = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got.append(chunk.choices[0].delta.content)
        if len(got) >= 5:
            break
    st = engine_state(engine_gateway)
    assert st["running"] == 1 and st["kv_used"] > 0, st
    stream.close()  # drops the connection mid-stream
    t_close = time.monotonic()
    idle = wait_idle(engine_gateway, timeout=10)
    took = time.monotonic() - t_close
    generated = idle["decode"] - before["decode"]
    assert generated < 200, "%d tokens decoded for a stream dropped after 5 (cancelled after %.2fs)" % (generated, took)
    time.sleep(0.3)
    assert engine_state(engine_gateway)["decode"] == idle["decode"], "decoding went on after the cancel"
    # the tier serves the next request normally
    assert greedy(engine_client, STORY, max_tokens=3).usage.completion_tokens == 3


def test_client_disconnect_cancels_a_non_stream_request(engine_gateway, engine_client):
    """A client that gives up on a non-streaming request (its timeout) must not leave the engine
    generating for nobody (up to max_tokens, holding KV pages, delaying shutdown)."""
    max_tokens = 300
    wait_idle(engine_gateway)
    before = engine_state(engine_gateway)
    impatient = engine_gateway.client(timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=TIER, messages=ESSAY, max_tokens=max_tokens, temperature=0)
    impatient.close()
    gone = time.monotonic()
    try:
        wait_idle(engine_gateway, timeout=5)
    except AssertionError:
        st = engine_state(engine_gateway)
        # let it finish so that later tests find an idle engine
        end = wait_idle(engine_gateway, timeout=300)
        pytest.fail("the client closed its connection %.1fs into a non-streaming request (max_tokens=%d); 5 s later "
                    "the engine still ran it (running=%d, kv pages used=%d) and went on until it had decoded %d tokens "
                    "in all, %.1fs after the client left" % (gone - t0, max_tokens, st["running"], st["kv_used"],
                                                             end["decode"] - before["decode"], time.monotonic() - gone))
    assert greedy(engine_client, STORY, max_tokens=3).usage.completion_tokens == 3


# ------------------------------------------------------------------ preemption (small KV pool)

def test_small_kv_pool_preempts_and_completes(gateway_factory, engine_model):
    # 4 MiB of 256 KiB pages = 16 pages; a page holds 11 tokens of SmolLM2-135M (30 layers x 2 x 3 heads
    # x 64 x f16 = 23040 bytes/token), so ~176 tokens for everybody; four ~42+32-token requests need ~300.
    # one CPU thread here (the shared gateway uses two): both kernel paths get exercised
    cfg = engine_config(free_port(), [engine_tier(TIER, engine_model, threads=1)], kv_pool_mb=4, kv_page_kb=256)
    gw = gateway_factory(cfg, dev_tls=False)
    client = gw.client(timeout=120)
    convs = [msgs("Write a detailed paragraph about %s, including its sights, its sounds and the people "
                  "you might meet there." % t) for t in TOPICS[:4]]
    solo = [greedy(client, m, max_tokens=32) for m in convs]
    assert engine_state(gw)["kv_total"] == 16
    assert engine_state(gw)["preemptions"] == 0, "a lone request was preempted"
    barrier = threading.Barrier(len(convs))

    def one(i):
        barrier.wait(10)
        if i % 2:
            return greedy(client, convs[i], max_tokens=32)
        pieces, finish, usage, _, _, _ = stream_chat(client, convs[i], max_tokens=32, temperature=0,
                                                     stream_options={"include_usage": True})
        return "".join(pieces), finish, usage

    with ThreadPoolExecutor(len(convs)) as ex:
        results = list(ex.map(one, range(len(convs))))
    for i, (s, r) in enumerate(zip(solo, results)):
        if i % 2:
            text, finish, usage = r.choices[0].message.content, [r.choices[0].finish_reason], r.usage
        else:
            text, finish, usage = r
        assert text == s.choices[0].message.content, "request %d: text after preemption differs from solo" % i
        assert finish == [s.choices[0].finish_reason]
        assert usage.completion_tokens == s.usage.completion_tokens
    st = wait_idle(gw)
    assert st["preemptions"] > 0, "no preemption although the requests needed ~1.7x the KV pool"
    client.close()


def test_q8_kv_tier_fits_what_f16_preempted(gateway_factory, engine_model):
    # The workload of the test above on a kv_dtype q8 tier: the same 16 pages of 256 KiB hold 22
    # tokens each (11880 bytes a token), ~352 tokens, enough for the ~300 the four requests need.
    # Through the official SDK: concurrent answers equal the tier's solo ones (q8 rounds a
    # token's K/V the same alone or batched), and nobody was preempted.
    cfg = engine_config(free_port(), [engine_tier(TIER, engine_model, threads=1, kv_dtype="q8")],
                        kv_pool_mb=4, kv_page_kb=256)
    gw = gateway_factory(cfg, dev_tls=False)
    client = gw.client(timeout=120)
    convs = [msgs("Write a detailed paragraph about %s, including its sights, its sounds and the people "
                  "you might meet there." % t) for t in TOPICS[:4]]
    solo = [greedy(client, m, max_tokens=32) for m in convs]
    for s in solo:
        assert s.choices[0].message.content
    barrier = threading.Barrier(len(convs))

    def one(i):
        barrier.wait(10)
        return greedy(client, convs[i], max_tokens=32)

    with ThreadPoolExecutor(len(convs)) as ex:
        results = list(ex.map(one, range(len(convs))))
    for i, (s, r) in enumerate(zip(solo, results)):
        assert r.choices[0].message.content == s.choices[0].message.content, "request %d differs" % i
    st = wait_idle(gw)
    assert st["kv_total"] == 16
    assert st["preemptions"] == 0, "the q8 tier preempted a workload that fits its pages"
    client.close()


def _tier_key_refused(tmp_path, engine_model, message, **key):
    """--check-config on an engine tier with key set: exit 2 with message."""
    cfg = engine_config(free_port(), [engine_tier(TIER, engine_model, threads=1, **key)])
    p = tmp_path / "bad-key.yaml"
    p.write_text(to_yaml(cfg))
    r = subprocess.run([str(LLMGW_BIN), "--check-config", str(p)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert message in r.stderr


def test_kv_dtype_is_checked_at_startup(tmp_path, engine_model):
    _tier_key_refused(tmp_path, engine_model, "'kv_dtype' must be f16 or q8", kv_dtype="q4")


def test_device_is_checked_and_a_missing_backend_is_refused(tmp_path, gateway_factory, engine_model):
    """tiers[].device: a name that is no device fails --check-config where it stands; a CUDA
    device on a machine without one fails the start with the tier and the reason, never a crash
    or a silent CPU in its place; `cpu` serves (`auto`, the default, is what every other engine
    test runs on)."""
    _tier_key_refused(tmp_path, engine_model, "'device' must be cpu, cuda, cuda:N or auto",
                      device="gpu0")
    if not os.path.exists("/dev/nvidiactl"):
        cfg = engine_config(free_port(), [engine_tier(TIER, engine_model, threads=1,
                                                      device="cuda:0")], kv_pool_mb=16)
        p = tmp_path / "cuda.yaml"
        p.write_text(to_yaml(cfg))
        try:
            r = subprocess.run([str(LLMGW_BIN), "-c", str(p)], capture_output=True, text=True,
                               timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("llmgw with device cuda:0 and no CUDA device was still running after 60 s")
        out = r.stdout + r.stderr
        assert r.returncode > 0, "rc=%r\n%s" % (r.returncode, out[-3000:])
        assert "tier '%s'" % TIER in r.stderr and "cuda:0" in r.stderr, r.stderr[-2000:]
        assert "Sanitizer" not in out and "Segmentation" not in out, out[-3000:]
    cfg = engine_config(free_port(), [engine_tier(TIER, engine_model, threads=1, device="cpu")],
                        kv_pool_mb=16)
    gw = gateway_factory(cfg, dev_tls=False)
    r = greedy(gw.client(timeout=120), msgs("Say hello."), max_tokens=4)
    assert r.choices[0].message.content


def test_engine_on_the_device_path_answers_as_the_cpu(gateway_factory, engine_model):
    """Tiers on the `shadow` device (the CPU under a GPU's memory discipline: weights placed in
    backend buffers, activations and the KV pool out of the host's reach, logits copied out;
    any host access faults) serve through the SDK exactly what the CPU tiers serve: streamed
    and not, several requests batched at once, and with draft-model speculation (drafts
    verified and rolled back on the device path). The path a CUDA tier takes, checked here."""
    answers = {}
    qs = ["Name three colours.", "What is 2 + 2?", "Say hello in French."]
    for dev in ("cpu", "shadow"):
        cfg = engine_config(free_port(), [
            engine_tier(TIER, engine_model, threads=1, device=dev),
            engine_tier("dft", engine_model, threads=1, aliases=(), device=dev),
            engine_tier("spec", engine_model, threads=1, aliases=(), device=dev,
                        draft_tier="dft", draft_always=True, draft_max=4),
        ], kv_pool_mb=32)
        gw = gateway_factory(cfg, dev_tls=False)
        client = gw.client(timeout=180)
        with ThreadPoolExecutor(3) as ex:
            solo = list(ex.map(lambda q: greedy(client, msgs(q), max_tokens=24)
                               .choices[0].message.content, qs))
        spec = client.chat.completions.create(model="spec", messages=msgs(qs[0]), max_tokens=24,
                                              temperature=0).choices[0].message.content
        stream = client.chat.completions.create(model=TIER, messages=msgs(qs[0]), max_tokens=24,
                                                temperature=0, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        answers[dev] = (solo, spec, streamed)
    assert answers["shadow"] == answers["cpu"], answers
    assert answers["cpu"][2] == answers["cpu"][1] == answers["cpu"][0][0], answers


# ------------------------------------------------------------------ broken model files

def _engine_yaml(tmp_path, model_path):
    if not LLMGW_BIN.exists():
        pytest.fail("llmgw binary not found at %s" % LLMGW_BIN, pytrace=False)
    cfg = engine_config(free_port(), [engine_tier(TIER, model_path, threads=1)], kv_pool_mb=16)
    p = tmp_path / "engine.yaml"
    p.write_text(to_yaml(cfg))
    return p


def _broken_model(tmp_path, engine_model, kind):
    p = tmp_path / ("broken-%s.gguf" % kind)
    data = engine_model.read_bytes() if kind == "half" else None
    if kind == "truncated":
        with open(engine_model, "rb") as f:
            p.write_bytes(f.read(1000))
    elif kind == "half":
        p.write_bytes(data[:len(data) // 2])
    elif kind == "garbage":
        p.write_bytes(bytes((i * 131 + 7) % 256 for i in range(8192)))
    elif kind == "empty":
        p.write_bytes(b"")
    elif kind == "huge-count":
        with open(engine_model, "rb") as f:
            head = bytearray(f.read(1 << 16))
        head[8:16] = (1 << 62).to_bytes(8, "little")  # n_tensors
        p.write_bytes(bytes(head))
    return p


def test_check_config_accepts_the_engine_config(tmp_path, engine_model):
    p = subprocess.run([str(LLMGW_BIN), "--check-config", str(_engine_yaml(tmp_path, engine_model))],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "rc=%d\nstdout:%s\nstderr:%s" % (p.returncode, p.stdout, p.stderr)


def test_check_config_rejects_a_truncated_model(tmp_path, engine_model):
    bad = _broken_model(tmp_path, engine_model, "truncated")
    cfg = _engine_yaml(tmp_path, bad)
    p = subprocess.run([str(LLMGW_BIN), "--check-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert p.returncode not in (0, None) and p.returncode > 0, "rc=%r stderr=%r" % (p.returncode, p.stderr)
    assert bad.name in p.stderr, "the message does not name the model file: %r" % p.stderr
    assert "Sanitizer" not in p.stderr and "Segmentation" not in p.stderr, p.stderr


@pytest.mark.parametrize("kind", ["truncated", "half", "garbage", "empty", "huge-count", "missing"])
def test_start_with_a_broken_model_fails_cleanly(tmp_path, engine_model, kind):
    bad = tmp_path / "no-such-model.gguf" if kind == "missing" else _broken_model(tmp_path, engine_model, kind)
    cfg = _engine_yaml(tmp_path, bad)
    try:
        p = subprocess.run([str(LLMGW_BIN), "-c", str(cfg)], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("llmgw with a %s model file was still running after 60 s" % kind)
    out = p.stdout + p.stderr
    assert p.returncode > 0, "llmgw with a %s model file: rc=%r (negative = killed by a signal)\n%s" % (
        kind, p.returncode, out[-3000:])
    assert bad.name in p.stderr, "the message does not name the model file: %r" % p.stderr[-2000:]
    assert "Sanitizer" not in out and "Segmentation" not in out and "Aborted" not in out, out[-3000:]


def test_shared_system_prompt_reuses_kv_pages(engine_gateway, engine_client):
    """Requests that share a long system prompt take its full KV pages from the tier's prefix
    table (llmgw_engine_prefix_hit_tokens_total grows) and answer exactly as without it: the
    same request again gives the same tokens."""
    system = ("You are the support assistant of a hardware store. Be brief, friendly and precise. "
              "Never recommend a competitor. If you do not know a product, say so plainly. " * 3)

    def hits():
        text = requests.get(engine_gateway.http + "/metrics", timeout=5).text
        return metric_value(text, "llmgw_engine_prefix_hit_tokens_total", tier="small") or 0

    def ask(q):
        r = engine_client.chat.completions.create(
            model="gpt-4o-mini", temperature=0, max_tokens=12,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
        return r.choices[0].message.content

    first = ask("Do you sell hammers?")
    before = hits()
    ask("Where is the paint aisle?")
    assert hits() > before
    assert ask("Do you sell hammers?") == first


def test_n_choices(engine_client):
    """n > 1: one sequence per choice, indexed 0..n-1, each with its own finish_reason; usage
    counts the prompt once and every choice's tokens; a seed makes the n choices reproducible;
    at temperature 0 every choice is the greedy answer; streaming interleaves the choices."""
    r = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, n=3,
                                              temperature=1.0, seed=11)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in r.choices)
    again = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, n=3,
                                                  temperature=1.0, seed=11)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    one = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, n=1,
                                                temperature=1.0, seed=11)
    assert one.choices[0].message.content == r.choices[0].message.content
    assert r.usage.prompt_tokens == one.usage.prompt_tokens
    greedy_n = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, n=2,
                                                     temperature=0)
    assert greedy_n.choices[0].message.content == greedy_n.choices[1].message.content
    greedy_1 = engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, temperature=0)
    assert greedy_n.choices[0].message.content == greedy_1.choices[0].message.content
    assert greedy_n.usage.completion_tokens == 2 * greedy_1.usage.completion_tokens
    texts, finishes = {}, {}
    for chunk in engine_client.chat.completions.create(model=TIER, messages=STORY, max_tokens=8, n=2,
                                                       temperature=1.0, seed=11, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert sorted(texts) == [0, 1] and sorted(finishes) == [0, 1]
    assert texts[0] == r.choices[0].message.content and texts[1] == r.choices[1].message.content

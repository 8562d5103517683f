"""Property: every byte llmgw sends is valid UTF-8 and valid JSON.

A byte-level BPE model emits an emoji or a CJK character as several tokens of one to three bytes
each, so a token boundary (and a max_tokens cut) often falls inside a character. The engine must
never let such a fragment out: a byte that can never complete a character becomes U+FFFD, and an
incomplete sequence still pending when generation ends (cut by max_tokens) is dropped.

One private gateway serves two engine tiers, `small` (SmolLM2-135M Q4_1) and `large` (the Q8_0
stand-in that scripts/make-standin converts), with the in-process semantic cache on so that cache
replays are covered too. Every endpoint is driven with raw HTTP (`requests`, reading bytes) so
that no client library decodes or repairs anything: /v1/chat/completions and /v1/completions,
stream and non-stream, n=1 and n=3 (seeded), logprobs, and cache replays, at many max_tokens
values, on prompts that make the model answer in emoji and CJK. Every response body and every SSE
`data:` payload must decode as strict UTF-8 and parse as JSON (the literal [DONE] aside), every
string in it must be encodable (no lone surrogates from \\u escapes), no object may repeat a key,
and every logprobs `bytes` field must be a list of ints 0..255.

Greedy decoding (temperature 0) and seeded sampling are deterministic, so streamed text must
equal the non-stream text of the same request.
"""

import codecs
import json
import time

import pytest
import requests

from llmgw_it import ROOT, Gateway, engine_config, engine_tier, free_port, require_engine_model

LARGE_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.F16.gguf"
ENCODER_DIR = ROOT / "models" / "all-MiniLM-L6-v2"
AUTH = {"Authorization": "Bearer sk-test-a"}
# Generate (never answer from the cache) and store nothing: the text is the engine's own.
FRESH = {"Cache-Control": "no-cache, no-store"}
SYSTEM = "You are a helpful assistant."

PROMPTS = {
    "party-emoji": "Reply with only the emoji 🎉",
    "japanese": "Translate 'good morning' to Japanese",
    "sea-emoji": "Write three emoji about the sea",
    "chinese": "用中文回答：天空是什么颜色？",
}
TIERS = ["small", "large"]
# An emoji is three or four tokens of this model, a CJK character one or two: every cut position
# of the first characters, then a few longer answers.
CHAT_MAX_TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, 12, 20]
COMPLETION_MAX_TOKENS = [1, 2, 3, 4, 5, 7]


def chatml(user):
    """The ChatML text a chat request with SYSTEM and `user` renders to: /v1/completions on it
    answers like the chat endpoint (in emoji and CJK)."""
    return ("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"
            % (SYSTEM, user))


def messages(user):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


# ------------------------------------------------------------------ the gateway

@pytest.fixture(scope="module")
def utf8_gateway(tmp_path_factory):
    model = require_engine_model()
    if not ENCODER_DIR.is_dir():
        pytest.fail("encoder model not found at %s -- run scripts/fetch-models" % ENCODER_DIR, pytrace=False)
    tiers = [engine_tier("small", model, threads=2, aliases=(), context=1024, max_batch_tokens=256, max_seqs=8)]
    if LARGE_MODEL.is_file():
        tiers.append(engine_tier("large", LARGE_MODEL, threads=2, aliases=(), context=1024, max_batch_tokens=256,
                                 max_seqs=8))
    cfg = engine_config(free_port(), tiers, kv_pool_mb=64, kv_page_kb=256)
    cfg["encoder"] = {"model_dir": str(ENCODER_DIR), "threads": 1, "batch_window_us": 500}
    cfg["cache"] = {"enabled": True, "threshold": 0.985, "ttl_s": 600, "max_mb": 64, "max_temperature": 0}
    gw = Gateway(tmp_path_factory.mktemp("utf8") / "gw", cfg, dev_tls=False)
    gw.start()
    gw.session = requests.Session()
    yield gw
    gw.session.close()
    rc = gw.stop()
    assert rc == 0, "llmgw did not exit 0 after SIGTERM (rc=%r)\nlog:\n%s" % (rc, gw.log_tail())


def need_tier(tier):
    if tier == "large" and not LARGE_MODEL.is_file():
        pytest.skip("the `large` stand-in %s is missing -- make it with `scripts/make-standin [BUILD_DIR]`"
                    % LARGE_MODEL.name)


# ------------------------------------------------------------------ the property

def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError("an object repeats the key(s) %r: %r" % (dup, pairs))
    return dict(pairs)


def _check_tree(v, where):
    """Every string (keys too) is encodable as UTF-8, and every `bytes` field is a list of ints
    0..255."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise AssertionError("%s: a string with a lone surrogate (a \\u escape of half a pair): %r (%s)"
                                 % (where, v, e))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _check_tree(x, "%s[%d]" % (where, i))
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_tree(k, where + " key")
            if k == "bytes" and x is not None:
                assert isinstance(x, list) and all(type(b) is int and 0 <= b <= 255 for b in x), \
                    "%s.bytes is not a list of ints 0..255: %r" % (where, x)
            _check_tree(x, "%s.%s" % (where, k))


def parse_strict(raw, what):
    """bytes -> JSON value: strict UTF-8, strict JSON, no duplicate keys, no lone surrogates."""
    assert isinstance(raw, bytes)
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        lo = max(0, e.start - 40)
        pytest.fail("%s: not valid UTF-8 (%s); bytes %r around it: %r" % (what, e.reason, raw[e.start:e.end],
                                                                         raw[lo:e.end + 40]), pytrace=False)
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except ValueError as e:
        pytest.fail("%s: not valid JSON (%s): %r" % (what, e, raw[:2000]), pytrace=False)
    _check_tree(value, what)
    return value


def post(gw, path, body, headers=None):
    h = dict(AUTH)
    h.update(headers or {})
    r = gw.session.post(gw.http + path, json=body, headers=h, timeout=120)
    raw = r.content  # bytes as received; nothing decoded
    value = parse_strict(raw, "%s %s body" % (path, "HTTP %d" % r.status_code))
    assert r.status_code == 200, "%s: HTTP %d %r" % (path, r.status_code, raw[:500])
    return value, r.headers


def post_stream(gw, path, body, headers=None):
    """Streams, collecting raw bytes; returns (the parsed data: payloads, headers). Checks the
    SSE framing and that [DONE] comes last, once."""
    h = dict(AUTH)
    h.update(headers or {})
    body = dict(body, stream=True)
    with gw.session.post(gw.http + path, json=body, headers=h, timeout=120, stream=True) as r:
        raw = b"".join(r.iter_content(chunk_size=None))  # raw bytes, no charset decoding
        status, headers = r.status_code, r.headers
    if status != 200:
        parse_strict(raw, "%s stream HTTP %d body" % (path, status))
        pytest.fail("%s stream: HTTP %d %r" % (path, status, raw[:500]), pytrace=False)
    assert "text/event-stream" in headers.get("content-type", ""), headers
    assert b"\r" not in raw, "CR in the SSE stream: %r" % raw[:500]
    assert raw.endswith(b"\n\n"), "the stream does not end with a blank line: %r" % raw[-200:]
    events, done = [], 0
    for i, block in enumerate(raw[:-2].split(b"\n\n")):
        data = []
        for line in block.split(b"\n"):
            if line.startswith(b":"):
                continue  # an SSE comment (keep-alive)
            assert line.startswith(b"data: "), "event %d: a line that is not `data: `: %r" % (i, line[:300])
            data.append(line[6:])
        if not data:
            continue
        payload = b"\n".join(data)
        if payload == b"[DONE]":
            done += 1
            continue
        assert done == 0, "an event after [DONE]: %r" % payload[:300]
        events.append(parse_strict(payload, "%s event %d" % (path, i)))
    assert done == 1, "[DONE] seen %d times" % done
    for ev in events:
        assert "error" not in ev, "an error event in the stream: %r" % ev
    return events, headers


# ------------------------------------------------------------------ reassembly helpers

def chat_stream_text(events):
    """{index: (content, finish_reason)} and the usage of a chat stream."""
    texts, finish, usage = {}, {}, None
    for ev in events:
        assert ev["object"] == "chat.completion.chunk", ev
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev["choices"]:
            i = ch["index"]
            texts.setdefault(i, "")
            c = ch["delta"].get("content")
            if c:
                texts[i] += c
            if ch.get("finish_reason"):
                assert i not in finish, "two finish_reasons for choice %d" % i
                finish[i] = ch["finish_reason"]
    return {i: (texts[i], finish.get(i)) for i in texts}, usage


def chat_json_text(value):
    assert value["object"] == "chat.completion", value
    return {ch["index"]: (ch["message"]["content"] or "", ch["finish_reason"]) for ch in value["choices"]}


def completion_stream_text(events):
    texts, finish, usage = {}, {}, None
    for ev in events:
        assert ev["object"] == "text_completion", ev
        if ev.get("usage"):
            usage = ev["usage"]
        for ch in ev["choices"]:
            i = ch["index"]
            texts[i] = texts.get(i, "") + (ch.get("text") or "")
            if ch.get("finish_reason"):
                finish[i] = ch["finish_reason"]
    return {i: (texts[i], finish.get(i)) for i in texts}, usage


def completion_json_text(value):
    assert value["object"] == "text_completion", value
    return {ch["index"]: (ch["text"], ch["finish_reason"]) for ch in value["choices"]}


def pending_tail_free(entries_bytes, content, where):
    """The tokens' bytes spell the content: the content is what a UTF-8 decoder makes of them,
    an incomplete sequence at the very end left out. Only checked when nothing was replaced
    (the engine's and Python's U+FFFD policies need not agree on how many to write)."""
    joined = b"".join(bytes(b) for b in entries_bytes)
    if "\ufffd" in content:
        return
    want = codecs.getincrementaldecoder("utf-8")("replace").decode(joined, final=False)
    if "\ufffd" in want:
        return
    assert content == want, "%s: content %r, but the tokens' bytes %r decode to %r" % (where, content, joined, want)


# ------------------------------------------------------------------ chat: stream == non-stream

@pytest.mark.parametrize("max_tokens", CHAT_MAX_TOKENS)
@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("tier", TIERS)
def test_chat_greedy(utf8_gateway, tier, prompt, max_tokens):
    need_tier(tier)
    body = {"model": tier, "messages": messages(PROMPTS[prompt]), "max_tokens": max_tokens, "temperature": 0}
    value, headers = post(utf8_gateway, "/v1/chat/completions", body, FRESH)
    assert headers.get("x-llmgw-tier") == tier
    want = chat_json_text(value)
    assert list(want) == [0]
    assert value["usage"]["completion_tokens"] <= max_tokens
    events, _ = post_stream(utf8_gateway, "/v1/chat/completions",
                            dict(body, stream_options={"include_usage": True}), FRESH)
    got, usage = chat_stream_text(events)
    assert got.get(0, ("", None)) == want[0], "streamed %r, non-stream %r" % (got, want)
    assert usage and usage["completion_tokens"] == value["usage"]["completion_tokens"]


# ------------------------------------------------------------------ completions: stream == non-stream

@pytest.mark.parametrize("max_tokens", COMPLETION_MAX_TOKENS)
@pytest.mark.parametrize("prompt", ["party-emoji", "chinese"])
@pytest.mark.parametrize("tier", TIERS)
def test_completions_greedy(utf8_gateway, tier, prompt, max_tokens):
    need_tier(tier)
    body = {"model": tier, "prompt": chatml(PROMPTS[prompt]), "max_tokens": max_tokens, "temperature": 0}
    value, _ = post(utf8_gateway, "/v1/completions", body)
    want = completion_json_text(value)
    events, _ = post_stream(utf8_gateway, "/v1/completions", dict(body, stream_options={"include_usage": True}))
    got, usage = completion_stream_text(events)
    assert got == want, "streamed %r, non-stream %r" % (got, want)
    assert usage and usage["completion_tokens"] == value["usage"]["completion_tokens"]


# ------------------------------------------------------------------ logprobs

@pytest.mark.parametrize("max_tokens", [1, 2, 4, 7])
@pytest.mark.parametrize("prompt", ["sea-emoji", "chinese"])
@pytest.mark.parametrize("tier", TIERS)
def test_chat_logprobs(utf8_gateway, tier, prompt, max_tokens):
    need_tier(tier)
    body = {"model": tier, "messages": messages(PROMPTS[prompt]), "max_tokens": max_tokens, "temperature": 0,
            "logprobs": True, "top_logprobs": 3}
    value, _ = post(utf8_gateway, "/v1/chat/completions", body)
    ch = value["choices"][0]
    entries = ch["logprobs"]["content"]
    assert len(entries) == value["usage"]["completion_tokens"]
    for e in entries:
        assert isinstance(e["bytes"], list) and len(e["top_logprobs"]) == 3
        for t in e["top_logprobs"]:
            assert isinstance(t["bytes"], list)
    content = ch["message"]["content"] or ""
    pending_tail_free([e["bytes"] for e in entries], content, "chat logprobs")

    events, _ = post_stream(utf8_gateway, "/v1/chat/completions", body)
    got, _ = chat_stream_text(events)
    assert got[0] == (content, ch["finish_reason"])
    streamed = [e for ev in events for c in ev["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
    assert [(e["token"], e["bytes"]) for e in streamed] == [(e["token"], e["bytes"]) for e in entries]


@pytest.mark.parametrize("max_tokens", [2, 5])
@pytest.mark.parametrize("prompt", ["party-emoji", "japanese"])
@pytest.mark.parametrize("tier", TIERS)
def test_completions_logprobs(utf8_gateway, tier, prompt, max_tokens):
    need_tier(tier)
    body = {"model": tier, "prompt": chatml(PROMPTS[prompt]), "max_tokens": max_tokens, "temperature": 0,
            "logprobs": 2}
    value, _ = post(utf8_gateway, "/v1/completions", body)
    lp = value["choices"][0]["logprobs"]
    n = value["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n
    assert all(isinstance(t, str) for t in lp["tokens"])
    events, _ = post_stream(utf8_gateway, "/v1/completions", body)
    got, _ = completion_stream_text(events)
    assert got == completion_json_text(value)
    streamed = [t for ev in events for c in ev["choices"] if c.get("logprobs") for t in c["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]


# ------------------------------------------------------------------ n=3, seeded sampling

@pytest.mark.parametrize("max_tokens", [3, 7])
@pytest.mark.parametrize("prompt", ["sea-emoji", "japanese"])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("tier", TIERS)
def test_n3_seeded(utf8_gateway, tier, endpoint, prompt, max_tokens):
    need_tier(tier)
    common = {"model": tier, "max_tokens": max_tokens, "temperature": 0.9, "seed": 4242, "n": 3}
    if endpoint == "chat":
        path, body = "/v1/chat/completions", dict(common, messages=messages(PROMPTS[prompt]))
        as_json, as_stream = chat_json_text, chat_stream_text
    else:
        path, body = "/v1/completions", dict(common, prompt=chatml(PROMPTS[prompt]))
        as_json, as_stream = completion_json_text, completion_stream_text
    value, _ = post(utf8_gateway, path, body)
    want = as_json(value)
    assert sorted(want) == [0, 1, 2]
    events, _ = post_stream(utf8_gateway, path, body)
    got, _ = as_stream(events)
    for i in range(3):
        assert got.get(i, ("", None)) == want[i], "choice %d: streamed %r, non-stream %r" % (i, got.get(i), want[i])


# ------------------------------------------------------------------ cache replays

def _replay(gw, body, stream):
    """A plain request (cache lookups on) that must be answered from the cache; the answer stored
    right before may take a moment to be indexed, so a miss is retried a few times."""
    for attempt in range(5):
        if stream:
            events, headers = post_stream(gw, "/v1/chat/completions", body)
            text = chat_stream_text(events)[0]
        else:
            value, headers = post(gw, "/v1/chat/completions", body)
            text = chat_json_text(value)
        if headers.get("x-llmgw-cache") in ("exact", "semantic"):
            return text, headers
        time.sleep(0.2)
    pytest.fail("the same temperature-0 request was not answered from the cache (x-llmgw-cache: %r) -- an "
                "answer with invalid UTF-8 is never stored" % headers.get("x-llmgw-cache"), pytrace=False)


@pytest.mark.parametrize("first,max_tokens", [("json", 2), ("stream", 4)])
@pytest.mark.parametrize("prompt", list(PROMPTS))
@pytest.mark.parametrize("tier", TIERS)
def test_cache_replay(utf8_gateway, tier, prompt, first, max_tokens):
    """The first request generates (no-cache: no lookup, but the answer is stored), then the same
    request non-stream and stream comes from the cache: all of it valid, the same text."""
    need_tier(tier)
    body = {"model": tier, "messages": messages(PROMPTS[prompt]), "max_tokens": max_tokens, "temperature": 0}
    if first == "json":
        value, headers = post(utf8_gateway, "/v1/chat/completions", body, {"Cache-Control": "no-cache"})
        original = chat_json_text(value)[0]
    else:
        events, headers = post_stream(utf8_gateway, "/v1/chat/completions", body, {"Cache-Control": "no-cache"})
        original = chat_stream_text(events)[0][0]
    assert headers.get("x-llmgw-cache") == "bypass", headers
    replay_json, _ = _replay(utf8_gateway, body, stream=False)
    replay_stream, _ = _replay(utf8_gateway, body, stream=True)
    assert replay_json[0] == original == replay_stream[0], \
        "original %r, replayed %r (json) and %r (stream)" % (original, replay_json[0], replay_stream[0])

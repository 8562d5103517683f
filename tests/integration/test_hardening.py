"""Hostile-but-fair input: one parse that the gateway and the upstream agree on, every part of a
request in its cache identity, tiers that refuse what they cannot read, framing and context
errors, an upstream that hangs up, and idle sockets that must not starve real clients.

Each test here failed before the hardening of the request path (issue 10) and passes now.
"""

import json
import os
import socket
import time
from pathlib import Path

import pytest
import requests

from llmgw_it import (ROOT, Gateway, Stub, base_config, engine_config, engine_tier, expected, free_port,
                      metric_sum, metric_value, uniq, wait_until)

AUTH = {"Authorization": "Bearer sk-test-a", "Content-Type": "application/json"}
ENCODER_DIR = Path(os.environ.get("LLMGW_ENCODER_MODEL") or ROOT / "models" / "all-MiniLM-L6-v2")


def post_raw(gw, path, body, headers=None, timeout=30):
    """POSTs bytes exactly as given (no client-side JSON encoding)."""
    return requests.post(gw.http + path, data=body if isinstance(body, bytes) else body.encode(),
                         headers=headers or AUTH, timeout=timeout)


def error_of(r):
    assert r.headers.get("Content-Type", "").startswith("application/json"), r.text
    return r.json()["error"]


# ------------------------------------------------------------------ one parse

DUPLICATES = [
    # (name, body template with {m} for a unique marker, expected param)
    ("content", '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"What is 2+2? {m}",'
                '"content":"Answer: 5 {m}"}]}', "messages.[0].content"),
    ("messages", '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"What is 2+2? {m}"}],'
                 '"messages":[{"role":"user","content":"Answer: 5 {m}"}]}', "messages"),
    ("model", '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi {m}"}],"model":"gpt-4o"}',
     "model"),
    ("nested", '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi {m}"}],'
               '"response_format":{"type":"json_schema","json_schema":{"name":"a","name":"b"}}}',
     "response_format.json_schema.name"),
]


@pytest.mark.parametrize("name,template,param", DUPLICATES, ids=[d[0] for d in DUPLICATES])
def test_duplicate_keys_are_refused_and_never_forwarded(gateway, stub_a, stub_b, name, template, param):
    m = uniq()
    r = post_raw(gateway, "/v1/chat/completions", template.replace("{m}", m))
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["type"] == "invalid_request_error"
    assert e["code"] == "duplicate_key"
    assert e["param"] == param
    assert stub_a.requests_with(m) == [] and stub_b.requests_with(m) == []


@pytest.mark.parametrize("body", [
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"line1\nline2"}]}',
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"nul\x00here"}]}',
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"esc\\u0000aped nul"}]}',
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"temperature":+1}',
    b'{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":012}',
], ids=["raw_newline", "raw_nul", "escaped_nul", "plus_number", "leading_zero"])
def test_non_rfc8259_bodies_are_refused(gateway, body):
    r = post_raw(gateway, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["type"] == "invalid_request_error"
    assert "parse the JSON body" in e["message"] and "at byte" in e["message"]


def test_upstream_gets_the_validated_request(gateway, stub_a):
    """The body upstream is printed from the one parse: the tier's model, integers as integers
    (cJSON's printer wrote a seed of 10^12 as 1e+12), escapes decoded, nothing the gateway did
    not judge."""
    m = uniq()
    body = ('{ "model" : "gpt-4o-mini" ,\n "seed": 1000000000000, "max_tokens": 7,'
            ' "messages": [{"role": "user", "content": "caf\\u00e9 \\ud83c\\udf89 %s"}],'
            ' "temperature": 0.25, "metadata": {"k": [1, 2.5, -3e2, true, null]}}' % m)
    r = post_raw(gateway, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    [rec] = stub_a.requests_with(m)
    b = rec["body"]
    assert b["model"] == "stub-small"
    assert b["seed"] == 10 ** 12 and isinstance(b["seed"], int)
    assert b["max_tokens"] == 7 and isinstance(b["max_tokens"], int)
    assert b["temperature"] == 0.25
    assert b["messages"][0]["content"] == "café 🎉 %s" % m
    assert b["metadata"] == {"k": [1, 2.5, -300, True, None]}


def _raw_http(gw, request_bytes, timeout=5):
    host, port = gw.http.replace("http://", "").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(request_bytes)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
    return data


@pytest.mark.parametrize("framing", [
    b"Content-Length: %d\r\nContent-Length: 5\r\n",
    b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n",
], ids=["two_content_lengths", "length_and_chunked"])
def test_conflicting_framing_is_400_and_closes(gateway, stub_a, framing):
    m = uniq()
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": m}]}).encode()
    if b"chunked" in framing:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-a\r\n"
            b"Content-Type: application/json\r\n" + (framing % len(body)) + b"\r\n")
    # A smuggled second request follows: it must never be answered.
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-test-a\r\n\r\n"
    data = _raw_http(gateway, head + body + smuggled)
    assert data.startswith(b"HTTP/1.1 400"), data[:200]
    if b"chunked" not in framing:  # libevent refuses chunked + Content-Length itself (its own page)
        assert b"invalid_framing" in data
    assert data.count(b"HTTP/1.1 ") == 1, "a second response came back on the same connection"
    assert stub_a.requests_with(m) == []


def test_upstream_that_hangs_up_is_reported_as_such(gateway):
    r = post_raw(gateway, "/v1/chat/completions",
                 json.dumps({"model": "gpt-4o-mini",
                             "messages": [{"role": "user", "content": "stub:close@alpha " + uniq()}]}))
    assert r.status_code == 502, r.text
    e = error_of(r)
    assert e["code"] == "upstream_closed"
    assert "closed the connection before sending a response" in e["message"]


# ------------------------------------------------------------------ the cache: every part counts

@pytest.fixture(scope="module")
def cache_gw(tmp_path_factory):
    if not (ENCODER_DIR / "model.safetensors").is_file():
        pytest.fail("encoder model not found at %s -- run scripts/fetch-models" % ENCODER_DIR, pytrace=False)
    d = tmp_path_factory.mktemp("hardening-cache")
    stub = Stub(d, "vision", chunk_delay=0.001)
    cfg = base_config(free_port(), tiers=[
        {"name": "vision", "kind": "upstream", "base_url": stub.base_url, "model": "stub-vision",
         "aliases": ["gpt-4o"]}], keys=[{"key": "sk-test-a", "group": "team-a"}],
        limits={"request_timeout_ms": 30000, "read_timeout_ms": 30000})
    cfg["encoder"] = {"model_dir": str(ENCODER_DIR), "name": "minilm", "threads": 1}
    cfg["cache"] = {"enabled": True, "ttl_s": 600, "max_mb": 16, "max_temperature": 0.0, "guard": True}
    gw = Gateway(d / "gw", cfg, dev_tls=False).start()
    yield gw, stub
    assert gw.stop() == 0, gw.log_tail()
    stub.stop()


def _ask(gw, content):
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30, json={
        "model": "gpt-4o", "temperature": 0, "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text
    return r.headers.get("x-llmgw-cache"), r.json()["choices"][0]["message"]["content"]


PARTS = {
    "image_url": lambda v: {"type": "image_url", "image_url": {"url": "https://example.com/%s.png" % v}},
    "image_data": lambda v: {"type": "image_url", "image_url": {
        "url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB" + v}},
    "input_audio": lambda v: {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF" + v,
                                                                      "format": "wav"}},
    "file": lambda v: {"type": "file", "file": {"file_id": "file-" + v}},
}


@pytest.mark.parametrize("kind", sorted(PARTS))
def test_non_text_parts_are_in_the_cache_identity(cache_gw, kind):
    gw, stub = cache_gw
    q = "What animal is in this picture? %s" % uniq()
    make = PARTS[kind]
    cat = [{"type": "text", "text": q}, make("cat")]
    dog = [{"type": "text", "text": q}, make("dog")]
    assert _ask(gw, cat)[0] == "miss"
    wait_until(lambda: _ask(gw, cat)[0] == "exact", 10, what="the cat answer to be cached")
    state, _ = _ask(gw, dog)
    assert state == "miss", "the dog picture was served the cat answer"
    assert sum(1 for r in stub.recorded() if q in json.dumps(r.get("body"))) == 2
    # Text alone is yet another question.
    assert _ask(gw, q)[0] == "miss"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_an_answer_that_is_not_utf8_is_never_stored(cache_gw, stream):
    gw, stub = cache_gw
    q = "stub:badutf8 tell me %s" % uniq()
    body = {"model": "gpt-4o", "temperature": 0, "stream": stream, "messages": [{"role": "user", "content": q}]}
    before = metric_sum(requests.get(gw.http + "/metrics", timeout=5).text, "llmgw_cache_refused_total") or 0
    for _ in range(2):
        r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30, json=body)
        assert r.status_code == 200
        assert b"\xf0\x9f" in r.content  # the upstream's bytes, passed through once each time
        assert r.headers.get("x-llmgw-cache") == "miss"
    assert sum(1 for x in stub.recorded() if q in json.dumps(x.get("body"))) == 2
    after = metric_sum(requests.get(gw.http + "/metrics", timeout=5).text, "llmgw_cache_refused_total")
    assert after == before + 2


def test_embedding_input_over_the_window_is_refused(cache_gw):
    gw, _ = cache_gw
    long_text = "word " * 400
    r = requests.post(gw.http + "/v1/embeddings", headers=AUTH, timeout=30,
                      json={"model": "minilm", "input": long_text})
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["code"] == "context_length_exceeded" and e["param"] == "input"
    r = requests.post(gw.http + "/v1/embeddings", headers=AUTH, timeout=30,
                      json={"model": "minilm", "input": ["short", long_text]})
    assert r.status_code == 400 and error_of(r)["param"] == "input.[1]"
    r = requests.post(gw.http + "/v1/embeddings", headers=AUTH, timeout=30,
                      json={"model": "minilm", "input": long_text, "truncate": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256
    # Exactly at the window is fine: 254 words + [CLS] + [SEP].
    r = requests.post(gw.http + "/v1/embeddings", headers=AUTH, timeout=30,
                      json={"model": "minilm", "input": "word " * 254})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 256


# ------------------------------------------------------------------ engine tiers

@pytest.fixture(scope="module")
def engine_plus(tmp_path_factory, engine_model):
    """An engine tier with a 4096 context whose config fallback is an upstream (vision) tier."""
    d = tmp_path_factory.mktemp("hardening-engine")
    stub = Stub(d, "remote", chunk_delay=0.001)
    cfg = engine_config(free_port(), [
        engine_tier("small", engine_model, threads=2, context=4096, fallback="remote"),
        {"name": "remote", "kind": "upstream", "base_url": stub.base_url, "model": "stub-remote"},
        engine_tier("textonly", engine_model, threads=1, aliases=(), context=1024),
        # A short context, so that filling it is quick even under the sanitizers.
        engine_tier("short", engine_model, threads=2, aliases=(), context=256, ngram_draft=4),
        # Draft-model speculation, drafting at every step (no measuring whether it pays): the
        # drafter is `textonly`'s model.
        engine_tier("drafted", engine_model, threads=1, aliases=(), context=512,
                    draft_tier="textonly", draft_always=True, draft_max=4),
    ])
    gw = Gateway(d / "gw", cfg, dev_tls=False).start()
    yield gw, stub
    assert gw.stop() == 0, gw.log_tail()
    stub.stop()


IMAGE_MSG = [{"role": "user", "content": [{"type": "text", "text": "What is in this image?"},
                                          {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]


def test_engine_tier_refuses_parts_it_cannot_read(engine_plus):
    gw, _ = engine_plus
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "textonly", "messages": IMAGE_MSG, "max_tokens": 4})
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["code"] == "unsupported_content"
    assert e["param"] == "messages.[0].content.[1]"
    assert "image_url" in e["message"]


def test_media_goes_to_a_tier_that_reads_it(engine_plus):
    gw, stub = engine_plus
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "small", "messages": IMAGE_MSG, "max_tokens": 4})
    assert r.status_code == 200, r.text
    assert r.headers["x-llmgw-tier"] == "remote"
    assert "image_url" in r.headers["x-llmgw-route-reason"]
    assert r.json()["choices"][0]["message"]["content"] == expected("remote", "What is in this image?")
    # Text alone stays on the engine tier.
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=60,
                      json={"model": "small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-llmgw-tier"] == "small"


def test_requests_go_to_a_tier_that_serves_them(engine_plus):
    """Capability-aware routing: a request an engine tier cannot serve (here n > 16 choices)
    routed to it goes down its chain to the upstream; with no such tier on the chain, the engine
    tier refuses it, naming the parameter."""
    gw, stub = engine_plus

    def moves():
        text = requests.get(gw.http + "/metrics", timeout=10).text
        return metric_value(text, "llmgw_route_capability_moves_total", **{"from": "small"}) or 0

    before = moves()
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "small", "messages": [{"role": "user", "content": "Hi?"}],
                            "max_tokens": 4, "n": 17})
    assert r.status_code == 200, r.text
    assert r.headers["x-llmgw-tier"] == "remote"
    assert "more than 16 choices (n): not on 'small'" in r.headers["x-llmgw-route-reason"]
    assert moves() == before + 1
    r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=30,
                      json={"model": "textonly", "messages": [{"role": "user", "content": "Hi?"}],
                            "max_tokens": 4, "n": 17})
    assert r.status_code == 400 and error_of(r)["param"] == "n", r.text


def _token_id(engine_model, text):
    """The id of the vocabulary entry `text` (byte-level BPE spelling, e.g. 'Ġbanana')."""
    import gguf
    reader = gguf.GGUFReader(str(engine_model))
    f = reader.fields["tokenizer.ggml.tokens"]
    for i, idx in enumerate(f.data):
        if bytes(f.parts[idx]).decode("utf-8") == text:
            return i
    raise AssertionError("no token %r" % text)


def test_logit_bias_is_applied_on_engine_tiers(engine_gateway, engine_model):
    banana = _token_id(engine_model, "Ġbanana")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = requests.post(engine_gateway.http + "/v1/chat/completions", headers=AUTH, timeout=60, json={
        "model": "small", "messages": msgs, "temperature": 0, "max_tokens": 3,
        "logit_bias": {str(banana): 100}})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == " banana banana banana"
    # -100 on the greedy first token: the answer starts otherwise.
    plain = requests.post(engine_gateway.http + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "small", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 1,
        "logprobs": 1}).json()
    first = plain["choices"][0]["text"]
    first_id = _token_id(engine_model, first.replace(" ", "Ġ"))
    banned = requests.post(engine_gateway.http + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "small", "prompt": "The capital of France is", "temperature": 0, "max_tokens": 1,
        "logit_bias": {str(first_id): -100}}).json()
    assert banned["choices"][0]["text"] != first
    # An id outside the vocabulary is the client's mistake.
    r = requests.post(engine_gateway.http + "/v1/chat/completions", headers=AUTH, timeout=60, json={
        "model": "small", "messages": msgs, "max_tokens": 1, "logit_bias": {"999999": 5}})
    assert r.status_code == 400 and error_of(r)["param"] == "logit_bias", r.text


def test_prompt_plus_max_tokens_over_the_context_is_400(engine_plus):
    gw, _ = engine_plus
    # Tier `short` has a 256-token context.
    r = requests.post(gw.http + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "short", "prompt": [42] * 250, "max_tokens": 16})
    assert r.status_code == 400, r.text
    e = error_of(r)
    assert e["code"] == "context_length_exceeded" and e["param"] == "prompt"
    assert "266" in e["message"] and "256" in e["message"]
    # Unset max_tokens: generate until the context is full.
    r = requests.post(gw.http + "/v1/completions", headers=AUTH, timeout=120, json={
        "model": "short", "prompt": [42] * 250, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 6


def test_prompt_lookup_speculation_drafts_and_answers(engine_plus):
    """Tier `short` drafts by prompt lookup: a greedy answer that repeats its prompt is drafted
    and verified (the metrics count both), and the answer is whole and valid."""
    gw, _ = engine_plus
    def drafted():
        text = requests.get(gw.http + "/metrics", timeout=5).text
        return metric_value(text, "llmgw_engine_draft_tokens_total", tier="short", drafter="ngram")
    before = drafted() or 0
    r = requests.post(gw.http + "/v1/completions", headers=AUTH, timeout=120, json={
        "model": "short", "prompt": "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,",
        "max_tokens": 24, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["text"]
    wait_until(lambda: (drafted() or 0) > before, 10, what="the tier's drafts in /metrics")
    text = requests.get(gw.http + "/metrics", timeout=5).text
    assert metric_value(text, "llmgw_engine_draft_accepted_total", tier="short", drafter="ngram") > 0


def test_draft_model_speculation_counts_by_drafter(engine_plus):
    """Tier `drafted` speculates with tier `textonly`'s model: greedy and sampled answers come
    back whole, and /metrics counts the drafts under drafter="textonly" (drafted = accepted +
    rejected, rounds, the drafter's own tokens)."""
    gw, _ = engine_plus
    def m(name, **labels):
        text = requests.get(gw.http + "/metrics", timeout=5).text
        return metric_value(text, name, tier="drafted", **labels) or 0
    before = m("llmgw_engine_draft_tokens_total", drafter="textonly")
    for temperature in (0, 0.8):
        r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=120, json={
            "model": "drafted", "max_tokens": 24, "temperature": temperature, "seed": 7,
            "messages": [{"role": "user", "content": "Name three rivers in Europe."}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] >= 1
        assert body["choices"][0]["message"]["content"]
    wait_until(lambda: m("llmgw_engine_draft_tokens_total", drafter="textonly") > before, 10,
               what="the drafts in /metrics")
    drafted = m("llmgw_engine_draft_tokens_total", drafter="textonly")
    accepted = m("llmgw_engine_draft_accepted_total", drafter="textonly")
    rejected = m("llmgw_engine_draft_rejected_total", drafter="textonly")
    assert accepted > 0 and drafted == accepted + rejected
    assert m("llmgw_engine_draft_rounds_total", drafter="textonly") > 0
    assert m("llmgw_engine_drafter_tokens_total") >= drafted
    assert m("llmgw_engine_draft_tokens_total", drafter="ngram") == 0


def test_token_id_prompt_longer_than_2048(engine_plus):
    gw, _ = engine_plus
    # Just past the old cap: a long prefill is slow under the sanitizers.
    r = requests.post(gw.http + "/v1/completions", headers=AUTH, timeout=400, json={
        "model": "small", "prompt": [42] * 2100, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 2100


# ------------------------------------------------------------------ connection slots

def test_idle_sockets_cannot_starve_clients(tmp_path, stub_a):
    cfg = base_config(free_port(), tiers=[
        {"name": "small", "kind": "upstream", "base_url": stub_a.base_url, "api_key": "sk-up-alpha",
         "model": "stub-small"}], keys=[{"key": "sk-test-a", "group": "team-a"}],
        limits={"max_connections": 16, "header_timeout_ms": 300, "request_timeout_ms": 20000})
    gw = Gateway(tmp_path / "gw", cfg, dev_tls=False).start()
    host, port = gw.http.replace("http://", "").split(":")
    idle = []
    try:
        # Three times more idle sockets than slots, some of them with half a request head.
        for i in range(48):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 3 == 0:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            idle.append(s)
        time.sleep(0.5)
        t0 = time.monotonic()
        for i in range(6):
            m = "legit %d %s" % (i, uniq())
            r = requests.post(gw.http + "/v1/chat/completions", headers=AUTH, timeout=10, json={
                "model": "small", "messages": [{"role": "user", "content": m}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == expected("alpha", m)
        assert time.monotonic() - t0 < 8
        shed = metric_sum(requests.get(gw.http + "/metrics", timeout=5).text, "llmgw_connections_shed_total")
        assert shed and shed >= 32 - 16
    finally:
        for s in idle:
            s.close()
        assert gw.stop() == 0, gw.log_tail()


def test_completion_top_logprobs_keep_tokens_that_differ_in_case(engine_gateway):
    """The legacy top_logprobs dict deduplicated its keys case-insensitively: ' end' vanished
    behind ' End'."""
    r = requests.post(engine_gateway.http + "/v1/completions", headers=AUTH, timeout=60, json={
        "model": "small", "prompt": "THE END. the end. The End.", "max_tokens": 4, "temperature": 0,
        "logprobs": 5})
    assert r.status_code == 200, r.text
    tops = r.json()["choices"][0]["logprobs"]["top_logprobs"]
    assert all(len(d) == 5 for d in tops), tops

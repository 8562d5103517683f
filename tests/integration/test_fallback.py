"""Upstream failures: fallback to another tier before the first byte, timeouts, mid-stream deaths."""

import time

import openai
import pytest
import requests

from llmgw_it import chat_text, expected, uniq


def test_dead_upstream_falls_back(client, stub_b):
    marker = uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="primary", messages=[{"role": "user", "content": marker}])
    assert chat_text(raw.parse()) == expected("beta", marker)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    up = stub_b.requests_with(marker)
    assert len(up) == 1 and up[0]["model"] == "stub-backup", "fallback tier's model rewrite not applied"


def test_dead_upstream_falls_back_for_streams(client):
    user = "stub:words=6 " + uniq()
    raw = client.chat.completions.with_raw_response.create(
        model="primary", messages=[{"role": "user", "content": user}], stream=True)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == expected("beta", user)


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_upstream_503_falls_back(client, stub_a, stub_b, stream):
    marker = uniq()
    # only the stub named alpha obeys the magic; the backup (beta) answers normally
    user = "stub:status=503@alpha " + marker
    raw = client.chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": user}], stream=stream)
    assert raw.headers.get("x-llmgw-tier") == "backup"
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = chat_text(raw.parse())
    assert text == expected("beta", user)
    assert len(stub_a.requests_with(marker)) >= 1, "the flaky tier was never tried"
    assert [r["model"] for r in stub_b.requests_with(marker)] == ["stub-backup"]


def test_upstream_connection_drop_falls_back(client, stub_b):
    marker = uniq()
    user = "stub:close@alpha " + marker
    raw = client.chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": user}])
    assert raw.headers.get("x-llmgw-tier") == "backup"
    assert chat_text(raw.parse()) == expected("beta", user)


def test_upstream_4xx_is_passed_through_not_fallen_back(client, stub_b):
    # a client error from the upstream is the client's problem, not a tier failure
    marker = uniq()
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="flaky",
                                       messages=[{"role": "user", "content": "stub:status=400@alpha " + marker}])
    assert ei.value.status_code == 400
    assert stub_b.requests_with(marker) == []


def test_upstream_error_without_fallback_is_5xx(client):
    with pytest.raises(openai.InternalServerError) as ei:
        client.chat.completions.create(model="small", messages=[{"role": "user", "content": "stub:status=503 " + uniq()}])
    assert ei.value.status_code in (502, 503)


# ------------------------------------------------------------------ failures without a fallback

def test_upstream_timeout_is_gateway_timeout(gateway, client):
    # tier `slow` has timeout_ms: 1000; the stub sleeps 5 s before answering
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as ei:
        client.chat.completions.create(model="slow", messages=[{"role": "user", "content": "stub:sleep=5 " + uniq()}])
    elapsed = time.monotonic() - t0
    assert ei.value.status_code == 504, "got %d %r" % (ei.value.status_code, ei.value.body)
    assert elapsed < 4, "gateway waited %.1fs for an upstream with timeout_ms 1000" % elapsed
    assert requests.get(gateway.http + "/healthz", timeout=5).status_code == 200


def test_upstream_dies_mid_stream_ends_client_stream(client, stub_a, stub_b):
    # after the first byte there is no fallback; the client stream must end (error or
    # truncated), promptly, with nothing from the backup tier spliced in
    marker = uniq()
    user = "stub:words=30 stub:abort=4@alpha " + marker
    before = stub_a.stats()["aborted_streams"]
    stream = client.chat.completions.create(model="flaky", messages=[{"role": "user", "content": user}],
                                            stream=True, timeout=10)
    parts, failed = [], None
    t0 = time.monotonic()
    try:
        for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
    except Exception as e:  # noqa: BLE001 - any clean error (or none: truncation) is acceptable
        failed = e
    assert time.monotonic() - t0 < 8, "client stream hung after the upstream died"
    text = "".join(parts)
    full = expected("alpha", user)
    assert text != full and full.startswith(text), "got %r (error %r)" % (text, failed)
    assert stub_a.stats()["aborted_streams"] == before + 1
    assert stub_b.requests_with(marker) == [], "fell back after the first byte had been sent"


def test_error_responses_carry_request_id(client):
    with pytest.raises(openai.NotFoundError) as ei:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}],
                                       extra_headers={"x-request-id": "err-rid-1"})
    assert ei.value.response.headers.get("x-request-id") == "err-rid-1"
